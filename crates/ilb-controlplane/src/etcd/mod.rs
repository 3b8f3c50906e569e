//! etcd's v3 gRPC API, client side only, generated ahead of time so that building needs no
//! protoc (as the `envoy-types` crate does for Envoy's protos): the packages of `auth.proto`,
//! `rpc.proto`, `kv.proto` and `v3election.proto` under the crate's `proto/` (see its README),
//! as tonic-prost-build 0.14.9 writes them (`build_server(false)`), unchanged.
//!
//! `tests/etcd_protos.rs` generates them again and fails when they differ from these files;
//! `ILB_REGENERATE_ETCD=1 cargo test -p ilb-controlplane --test etcd_protos` (with protoc)
//! writes them here, which is how they are made. They are included with `include!`, so rustfmt
//! leaves them as generated; the lints below are allowed on them only.

#[allow(dead_code, missing_docs, clippy::all, clippy::pedantic, clippy::too_many_lines)]
pub(crate) mod authpb {
    include!("authpb.rs");
}

#[allow(dead_code, missing_docs, clippy::all, clippy::pedantic, clippy::too_many_lines)]
pub(crate) mod etcdserverpb {
    include!("etcdserverpb.rs");
}

#[allow(dead_code, missing_docs, clippy::all, clippy::pedantic, clippy::too_many_lines)]
pub(crate) mod mvccpb {
    include!("mvccpb.rs");
}

#[allow(dead_code, missing_docs, clippy::all, clippy::pedantic, clippy::too_many_lines)]
pub(crate) mod v3electionpb {
    include!("v3electionpb.rs");
}
