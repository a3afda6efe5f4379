//! The reconcile error, counted by kind.

use super::names::FINALIZER;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("LockedJob has no namespace")]
    NoNamespace,
    #[error("the Job watch cache stopped; the operator is shutting down")]
    JobCacheGone,
    #[error("finalizer {FINALIZER}: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
}

impl Error {
    /// The kind, as `lockedjob_reconcile_errors_total{kind}` counts it.
    pub fn kind(&self) -> &'static str {
        use kube::runtime::finalizer::Error as F;
        match self {
            Error::Kube(_) => "kube",
            Error::NoNamespace => "no_namespace",
            Error::JobCacheGone => "job_cache_gone",
            Error::Finalizer(inner) => match inner.as_ref() {
                F::ApplyFailed(e) | F::CleanupFailed(e) => e.kind(),
                F::AddFinalizer(_) if self.is_finalizer_race() => "finalizer_race",
                F::AddFinalizer(_) | F::RemoveFinalizer(_) => "finalizer_patch",
                F::UnnamedObject | F::InvalidFinalizer => "finalizer",
            },
        }
    }

    /// Another replica added the finalizer first: kube's patch carries a JSON-patch `test` of
    /// the list it read, which fails with 422 (409 on a resourceVersion clash). Expected once
    /// per new LockedJob for all replicas but one; the watch brings the new version.
    pub fn is_finalizer_race(&self) -> bool {
        use kube::runtime::finalizer::Error as F;
        matches!(self, Error::Finalizer(inner) if matches!(inner.as_ref(),
            F::AddFinalizer(kube::Error::Api(status)) if status.code == 422 || status.code == 409))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_counted_by_kind_and_a_finalizer_race_is_told_apart() {
        use kube::runtime::finalizer::Error as F;
        let api = |code: u16| {
            let status: kube::core::Status =
                serde_json::from_value(serde_json::json!({"code": code})).expect("status");
            kube::Error::Api(Box::new(status))
        };
        let table = [
            (F::AddFinalizer(api(422)), "finalizer_race", true),
            (F::AddFinalizer(api(409)), "finalizer_race", true),
            (F::AddFinalizer(api(500)), "finalizer_patch", false),
            (F::RemoveFinalizer(api(422)), "finalizer_patch", false),
            (F::ApplyFailed(Error::JobCacheGone), "job_cache_gone", false),
        ];
        for (inner, kind, race) in table {
            let error = Error::Finalizer(Box::new(inner));
            assert_eq!(
                (error.kind(), error.is_finalizer_race()),
                (kind, race),
                "{error}"
            );
        }
    }
}
