//! kubesim with the project's CRDs installed (Established) and one namespace: what the
//! activator's tests against an API server start from.

use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kubesim::api::{ApiServer, ApiServerConfig};

/// Far longer than a CRD takes to be Established: reaching it means it never was.
const ESTABLISHED: Duration = Duration::from_secs(60);

/// kubesim started with `cfg`, with `deploy/crds/` (Revisions, ActivationEndpoints) and the
/// namespace `ns`.
pub async fn cluster(cfg: ApiServerConfig, ns: &str) -> anyhow::Result<ApiServer> {
    let api = ApiServer::start(cfg).await?;
    let client = api.client();
    apply_crds(&client).await?;
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client)
        .create(&PostParams::default(), &ns)
        .await?;
    Ok(api)
}

/// `deploy/crds/` (Revisions, ActivationEndpoints), each once it is Established.
pub async fn apply_crds(client: &kube::Client) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for file in ["revisions.yaml", "activationendpoints.yaml", "routes.yaml"] {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds/").to_string() + file;
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(&std::fs::read_to_string(&path)?)?;
        let name = crd.metadata.name.clone().context("CRD without a name")?;
        crds.create(&PostParams::default(), &crd).await?;
        tokio::time::timeout(
            ESTABLISHED,
            await_condition(crds.clone(), &name, conditions::is_crd_established()),
        )
        .await??;
    }
    Ok(())
}
