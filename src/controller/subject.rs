//! The LockedJob a reconcile or a run acts for, with the namespace reconcile checked: every
//! stage and status write addresses it by these, so none falls back to an empty namespace.

use super::error::Error;
use crate::api::LockedJob;
use k8s_openapi::NamespaceResourceScope;
use kube::{Api, Client, Resource, ResourceExt};
use std::sync::Arc;

#[derive(Clone)]
pub struct Subject {
    pub lj: Arc<LockedJob>,
    pub namespace: String,
    pub name: String,
}

impl Subject {
    /// Fails for an object without a namespace (LockedJob is namespaced; only a malformed
    /// object or a fake API server sends one).
    pub fn of(lj: Arc<LockedJob>) -> Result<Self, Error> {
        let namespace = lj.namespace().ok_or(Error::NoNamespace)?;
        let name = lj.name_any();
        Ok(Self {
            lj,
            namespace,
            name,
        })
    }

    /// The API of `K` in the LockedJob's namespace.
    pub fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(client.clone(), &self.namespace)
    }
}
