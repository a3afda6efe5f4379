//! Contract tests of the API-server stand-in, through the real `kube::Client`.
mod standin;

#[tokio::test]
async fn smoke() {
    let server = standin::ApiServer::start();
    let client = server.client().await;
    let v = client.apiserver_version().await.expect("version");
    assert_eq!(v.major, "1");
}
