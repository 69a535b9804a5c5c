//! The clusters the repository deploys to: the project's own YAML, Argo CD cluster Secrets, or
//! Argo CD's API (`GET /api/v1/clusters`, ADR 0008), parsed. Reading them live (a Kubernetes
//! client, an HTTP fetch) is the room above render: `crate::inventory`.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::yaml;

/// The server URL Argo CD uses for the cluster it runs in.
pub const IN_CLUSTER_SERVER: &str = "https://kubernetes.default.svc";
/// The name Argo CD gives that cluster when no Secret names it.
pub const IN_CLUSTER_NAME: &str = "in-cluster";
/// Annotations the project reads from a cluster Secret: Argo CD learns these from the live
/// cluster, an exported Secret does not carry them.
pub const SECRET_TYPE_LABEL: &str = "argocd.argoproj.io/secret-type";
pub const KUBE_VERSION_ANNOTATION: &str = "gitops-gate.io/kube-version";
pub const API_VERSIONS_ANNOTATION: &str = "gitops-gate.io/api-versions";

#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error(transparent)]
    Yaml(#[from] yaml::YamlError),
    #[error("{origin}: {message}")]
    Invalid { origin: String, message: String },
    #[error("{origin}: {message}")]
    Fetch { origin: String, message: String },
}

/// One destination cluster, as the clusters generator and helm see it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct Cluster {
    pub name: String,
    pub server: String,
    pub project: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// `x.y.z` as Argo CD passes it to helm (`v` and build suffixes removed), if known.
    pub kube_version: Option<String>,
    /// Discovery data: `group/version` and `group/version/Kind` entries, sorted, both forms.
    pub api_versions: Vec<String>,
    /// False for the implicit in-cluster destination, which has no Secret.
    pub has_secret: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct Inventory {
    /// Clusters with a Secret (or listed in the project's inventory), in file order.
    pub clusters: Vec<Cluster>,
    /// Values for the implicit in-cluster destination and clusters that state nothing.
    pub default_kube_version: Option<String>,
    pub default_api_versions: Vec<String>,
    /// Set when the source says there is no in-cluster destination (Argo CD's API lists none:
    /// `in-cluster` disabled, or hidden from the token): no implicit one is added, so an
    /// Application aimed at it is a destination Argo CD does not have.
    pub no_implicit_in_cluster: bool,
    /// Set when the source may leave clusters out without saying so (Argo CD's API lists only
    /// the clusters the token may `get`): an unknown destination is then never a mere note.
    pub partial_view: bool,
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ProjectDefaults {
    kube_version: Option<String>,
    #[serde(default)]
    api_versions: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ProjectCluster {
    name: String,
    server: String,
    #[serde(default)]
    project: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    kube_version: Option<String>,
    #[serde(default)]
    api_versions: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProjectInventory {
    #[serde(default)]
    defaults: ProjectDefaults,
    clusters: Vec<ProjectCluster>,
}

/// `v1.30.11+IKS` -> `1.30.11`, the way Argo CD's ParseGeneric reads a server version.
pub fn parse_kube_version(raw: &str) -> Option<String> {
    let trimmed = raw.trim().trim_start_matches('v');
    let mut numbers = Vec::new();
    for part in trimmed.split('.').take(3) {
        let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
        if digits.is_empty() {
            break;
        }
        numbers.push(digits.parse::<u64>().ok()?.to_string());
        if digits.len() != part.len() {
            break;
        }
    }
    match numbers.len() {
        0 => None,
        1 => Some(format!("{}.0.0", numbers[0])),
        2 => Some(format!("{}.{}.0", numbers[0], numbers[1])),
        _ => Some(numbers.join(".")),
    }
}

/// Expands `g/v/Kind` entries with their `g/v`, de-duplicates and sorts, as Argo CD does.
pub fn expand_api_versions<'a>(entries: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    let mut set = std::collections::BTreeSet::new();
    for entry in entries {
        let entry = entry.trim();
        if entry.is_empty() {
            continue;
        }
        set.insert(entry.to_string());
        let parts: Vec<&str> = entry.split('/').collect();
        match parts.len() {
            // core: v1/Pod
            2 if parts[1].starts_with(char::is_uppercase) => {
                set.insert(parts[0].to_string());
            }
            3 => {
                set.insert(format!("{}/{}", parts[0], parts[1]));
            }
            _ => {}
        }
    }
    set.into_iter().collect()
}

impl Inventory {
    /// Reads an inventory file: the project's format, a v1 List of Secrets, or Secrets as
    /// multi-document YAML.
    pub fn parse(text: &str, origin: &str) -> Result<Inventory, InventoryError> {
        let documents = yaml::parse_documents(text, origin)?;
        if documents.is_empty() {
            // An empty file is no fleet: reading it as one would leave every Application
            // without a destination, which is only a note when the merge base has it too.
            return Err(InventoryError::Invalid {
                origin: origin.to_string(),
                message: "the file holds no document (expected `clusters:` or cluster Secrets)"
                    .into(),
            });
        }
        let invalid = |message: String| InventoryError::Invalid {
            origin: origin.to_string(),
            message,
        };
        if documents.len() == 1 && documents[0].get("clusters").is_some() {
            let project: ProjectInventory = serde_path_to_error::deserialize(documents[0].clone())
                .map_err(|e| {
                    // The key as a path (`clusters[0].labels`), and the line the YAML parser
                    // stops at, so a person can go straight to it.
                    let path = e.path().to_string();
                    let line = serde_saphyr::from_str::<ProjectInventory>(text)
                        .err()
                        .and_then(|e| e.location().map(|l| l.line()));
                    let at = match line {
                        Some(line) => format!(" (line {line})"),
                        None => String::new(),
                    };
                    invalid(format!("`{path}`{at}: {}", e.inner()))
                })?;
            return Ok(Self::from_project(project));
        }
        Self::from_secret_documents(documents, origin)
    }

    /// Argo CD cluster Secrets (documents that are Secrets, or v1 Lists of them); other
    /// Secrets are skipped, anything else is refused.
    pub(crate) fn from_secret_documents(
        documents: Vec<Value>,
        origin: &str,
    ) -> Result<Inventory, InventoryError> {
        let invalid = |message: String| InventoryError::Invalid {
            origin: origin.to_string(),
            message,
        };
        let mut secrets = Vec::new();
        for doc in documents {
            if doc.get("kind").and_then(Value::as_str) == Some("List") {
                secrets.extend(
                    doc.get("items")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default(),
                );
            } else {
                secrets.push(doc);
            }
        }
        let mut inventory = Inventory::default();
        for (index, secret) in secrets.iter().enumerate() {
            if secret.get("kind").and_then(Value::as_str) != Some("Secret") {
                return Err(invalid(format!(
                    "item {index} is a {}, expected a cluster Secret or an inventory with `clusters:`",
                    secret
                        .get("kind")
                        .and_then(Value::as_str)
                        .unwrap_or("document without kind")
                )));
            }
            let labels = string_map(secret.pointer("/metadata/labels"));
            if labels
                .get("argocd.argoproj.io/secret-type")
                .map(String::as_str)
                != Some("cluster")
            {
                continue; // other Secrets (repositories, credentials) are not clusters
            }
            let field = |key: &str| -> Result<Option<String>, InventoryError> {
                secret_field(secret, key).map_err(|message| {
                    invalid(format!("Secret {}: {message}", secret_name(secret)))
                })
            };
            let server = field("server")?.ok_or_else(|| {
                invalid(format!("Secret {} has no data.server", secret_name(secret)))
            })?;
            let name = field("name")?.unwrap_or_else(|| server.clone());
            let annotations = string_map(secret.pointer("/metadata/annotations"));
            let kube_version = annotations
                .get(KUBE_VERSION_ANNOTATION)
                .and_then(|v| parse_kube_version(v));
            let api: Vec<String> = annotations
                .get(API_VERSIONS_ANNOTATION)
                .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
                .unwrap_or_default();
            let cluster = Cluster {
                name,
                server,
                project: field("project")?.unwrap_or_default(),
                labels,
                annotations,
                kube_version,
                api_versions: expand_api_versions(&api),
                has_secret: true,
            };
            // Argo CD keys cluster Secrets by name: a second Secret with the same name wins.
            inventory.clusters.retain(|c| c.name != cluster.name);
            inventory.clusters.push(cluster);
        }
        Ok(inventory)
    }

    /// Argo CD cluster Secrets for these clusters, annotated with what the project reads
    /// (kube version, API versions): what an operator applies so a live inventory renders as
    /// this file does.
    pub fn cluster_secrets(&self, namespace: &str) -> Vec<Value> {
        use base64::Engine;
        let encode = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
        self.clusters
            .iter()
            .map(|cluster| {
                let mut annotations = cluster.annotations.clone();
                if let Some(version) = &cluster.kube_version {
                    annotations.insert(KUBE_VERSION_ANNOTATION.into(), version.clone());
                }
                if !cluster.api_versions.is_empty() {
                    annotations.insert(
                        API_VERSIONS_ANNOTATION.into(),
                        cluster.api_versions.join(","),
                    );
                }
                let mut labels = cluster.labels.clone();
                labels.insert(SECRET_TYPE_LABEL.into(), "cluster".into());
                let mut data = serde_json::json!({
                    "name": encode(&cluster.name),
                    "server": encode(&cluster.server),
                    "config": encode("{}"),
                });
                if !cluster.project.is_empty() {
                    data["project"] = encode(&cluster.project).into();
                }
                serde_json::json!({
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "type": "Opaque",
                    "metadata": {
                        "name": format!("cluster-{}", cluster.name),
                        "namespace": namespace,
                        "labels": labels,
                        "annotations": annotations,
                    },
                    "data": data,
                })
            })
            .collect()
    }

    fn from_project(project: ProjectInventory) -> Inventory {
        let defaults = project.defaults;
        let default_kube_version = defaults
            .kube_version
            .as_deref()
            .and_then(parse_kube_version);
        let clusters = project
            .clusters
            .into_iter()
            .map(|mut c| {
                // Every Argo CD cluster Secret carries this label, and selectors use it.
                c.labels
                    .entry(SECRET_TYPE_LABEL.to_string())
                    .or_insert_with(|| "cluster".to_string());
                c
            })
            .map(|c| Cluster {
                kube_version: c
                    .kube_version
                    .as_deref()
                    .and_then(parse_kube_version)
                    .or_else(|| default_kube_version.clone()),
                api_versions: expand_api_versions(
                    defaults.api_versions.iter().chain(&c.api_versions),
                ),
                name: c.name,
                server: c.server,
                project: c.project,
                labels: c.labels,
                annotations: c.annotations,
                has_secret: true,
            })
            .collect();
        Inventory {
            clusters,
            default_api_versions: expand_api_versions(&defaults.api_versions),
            default_kube_version,
            no_implicit_in_cluster: false,
            partial_view: false,
        }
    }

    /// Clusters as Argo CD's API lists them (`GET /api/v1/clusters`, a `ClusterList`), with
    /// what its cluster cache learned from each live cluster (`info.serverVersion`,
    /// `info.apiVersions`; Argo CD v3.5 `ClusterInfo`).
    ///
    /// - The API drops the `argocd.argoproj.io/secret-type` label from its view, while the
    ///   clusters generator selects on the Secret's own labels: it is put back on every cluster
    ///   that has a Secret.
    /// - The in-cluster destination Argo CD lists without a Secret cannot be told from one with
    ///   a bare Secret in the API's view, so it is read as having one: a label selector on
    ///   `secret-type` then matches it where Argo CD would not, which renders an Application
    ///   more, never one less. Its discovered versions are also the defaults.
    /// - A cluster whose cache has no API list yet (no Application has been synced to it), or
    ///   whose last connection did not succeed (`info.connectionState.status` other than
    ///   `Successful`: the list may be stale or partial), falls back to the
    ///   `gitops-gate.io/api-versions` annotation of its Secret, which the API passes through;
    ///   with neither, the read fails closed naming the cluster: rendering it as if it served
    ///   nothing but the built-in kinds could turn a red gate green.
    /// - An empty list fails closed too (a token without `clusters, get` sees none), and a
    ///   list without the in-cluster destination means Argo CD has none: no implicit one is
    ///   added.
    pub fn from_argocd_clusters(list: &Value, origin: &str) -> Result<Inventory, InventoryError> {
        let invalid = |message: String| InventoryError::Invalid {
            origin: origin.to_string(),
            message,
        };
        let items = list
            .get("items")
            .map(|items| match items {
                Value::Array(items) => Ok(items.clone()),
                Value::Null => Ok(Vec::new()),
                other => Err(invalid(format!("`items` is not a list: {other}"))),
            })
            .transpose()?
            .ok_or_else(|| invalid("not a ClusterList (no `items`)".into()))?;
        if items.is_empty() {
            return Err(invalid(
                "Argo CD lists no cluster: the token may see none (it needs the RBAC permission `clusters, get`)".into(),
            ));
        }
        let mut inventory = Inventory {
            no_implicit_in_cluster: true,
            partial_view: true,
            ..Inventory::default()
        };
        for (index, item) in items.iter().enumerate() {
            let text = |pointer: &str| item.pointer(pointer).and_then(Value::as_str).unwrap_or("");
            let server = text("/server").trim_end_matches('/').to_string();
            if server.is_empty() {
                return Err(invalid(format!("item {index} has no server")));
            }
            let name = match text("/name") {
                "" => server.clone(),
                name => name.to_string(),
            };
            let mut labels = string_map(item.get("labels"));
            let annotations = string_map(item.get("annotations"));
            let kube_version = Some(text("/info/serverVersion"))
                .filter(|v| !v.is_empty())
                .or_else(|| annotations.get(KUBE_VERSION_ANNOTATION).map(String::as_str))
                .and_then(parse_kube_version);
            let connected = matches!(text("/info/connectionState/status"), "Successful" | "")
                && text("/connectionState/status") != "Failed";
            let discovered: Vec<String> = item
                .pointer("/info/apiVersions")
                .filter(|_| connected)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect();
            let api: Vec<String> = if !discovered.is_empty() {
                discovered
            } else if let Some(listed) = annotations.get(API_VERSIONS_ANNOTATION) {
                listed.split(',').map(|s| s.trim().to_string()).collect()
            } else {
                return Err(invalid(format!(
                    "cluster {name} ({server}): Argo CD's cache has {} for it (it learns one once an Application is synced there and the connection succeeds); annotate its Secret with {API_VERSIONS_ANNOTATION} or read the inventory from the Secrets or a file",
                    if connected {
                        "no API list"
                    } else {
                        "no trustworthy API list (the connection did not succeed)"
                    }
                )));
            };
            if server == IN_CLUSTER_SERVER {
                inventory.default_kube_version = kube_version.clone();
                inventory.default_api_versions = expand_api_versions(&api);
            }
            labels.insert(SECRET_TYPE_LABEL.to_string(), "cluster".to_string());
            let cluster = Cluster {
                project: text("/project").to_string(),
                labels,
                annotations,
                kube_version,
                api_versions: expand_api_versions(&api),
                has_secret: true,
                name,
                server,
            };
            inventory.clusters.retain(|c| c.name != cluster.name);
            inventory.clusters.push(cluster);
        }
        Ok(inventory)
    }

    /// The in-cluster destination Argo CD always has, unless a Secret already names its server.
    pub fn implicit_in_cluster(&self) -> Option<Cluster> {
        if self.no_implicit_in_cluster
            || self.clusters.iter().any(|c| c.server == IN_CLUSTER_SERVER)
        {
            return None;
        }
        Some(Cluster {
            name: IN_CLUSTER_NAME.to_string(),
            server: IN_CLUSTER_SERVER.to_string(),
            project: String::new(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            kube_version: self.default_kube_version.clone(),
            api_versions: self.default_api_versions.clone(),
            has_secret: false,
        })
    }

    /// Every valid destination: the listed clusters and the implicit in-cluster one.
    pub fn destinations(&self) -> Vec<Cluster> {
        let mut all = self.clusters.clone();
        all.extend(self.implicit_in_cluster());
        all
    }

    /// Finds an Application's destination by server URL or by cluster name. Searches the
    /// listed clusters in place (a fleet of 600 is searched 600 times per render).
    /// Borrowed when listed: a cluster carries its whole discovery list, and every planned
    /// Application asks.
    pub fn destination(
        &self,
        server: Option<&str>,
        name: Option<&str>,
    ) -> Option<std::borrow::Cow<'_, Cluster>> {
        let matches = |c: &Cluster| match (
            server.filter(|s| !s.is_empty()),
            name.filter(|n| !n.is_empty()),
        ) {
            (Some(server), _) => c.server.trim_end_matches('/') == server.trim_end_matches('/'),
            (None, Some(name)) => c.name == name,
            (None, None) => false,
        };
        self.clusters
            .iter()
            .find(|c| matches(c))
            .map(std::borrow::Cow::Borrowed)
            .or_else(|| {
                self.implicit_in_cluster()
                    .filter(matches)
                    .map(std::borrow::Cow::Owned)
            })
    }
}

fn secret_name(secret: &Value) -> String {
    secret
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("<unnamed>")
        .to_string()
}

fn secret_field(secret: &Value, key: &str) -> Result<Option<String>, String> {
    if let Some(v) = secret
        .pointer(&format!("/stringData/{key}"))
        .and_then(Value::as_str)
    {
        return Ok(Some(v.to_string()));
    }
    if let Some(v) = secret
        .pointer(&format!("/data/{key}"))
        .and_then(Value::as_str)
    {
        use base64::Engine;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(v.trim())
            .map_err(|e| format!("data.{key} is not base64: {e}"))?;
        return Ok(Some(String::from_utf8_lossy(&bytes).to_string()));
    }
    Ok(None)
}

fn string_map(value: Option<&Value>) -> BTreeMap<String, String> {
    value
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.as_str()
                            .map(str::to_string)
                            .unwrap_or_else(|| v.to_string()),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
