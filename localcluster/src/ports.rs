/// A free loopback port: bind port 0 and read what the kernel chose. A small race remains
/// until the server binds it, which the callers accept (a failed start says so).
pub fn free_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}
