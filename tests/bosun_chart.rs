//! Bosun's Helm chart, rendered with the real helm: the config it writes is one Bosun reads;
//! by default it holds no permission in the cluster (the inventory is Argo CD's API), the
//! cluster-Secret reader is an explicit opt-in, and its egress is only what bosun.yaml names.

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

mod common;

use serde_json::{Value, json};

fn template(args: &[&str]) -> std::process::Output {
    let mut all = vec![
        "--set",
        "config.repositories[0].slug=platform/gitops",
        "--set",
        "config.repositories[0].url=https://github.com/platform/gitops.git",
    ];
    all.extend_from_slice(args);
    common::helm_template("bosun", "bosun", &all)
}

fn objects(args: &[&str]) -> Vec<Value> {
    common::rendered_objects(&template(args))
}

/// Every rule that grants anything, from every Role, ClusterRole and binding the chart renders.
fn grants(rendered: &[Value]) -> Vec<Value> {
    rendered
        .iter()
        .filter(|o| matches!(o["kind"].as_str(), Some("Role" | "ClusterRole")))
        .map(|o| json!({"kind": o["kind"], "namespace": o["metadata"]["namespace"], "rules": o["rules"]}))
        .collect()
}

/// The hosts Bosun itself would call with this bosun.yaml: the forge, the model, the
/// release-notes hosts.
fn program_hosts(config: &gitops_loop::bosun::config::Config) -> Vec<String> {
    let host = |url: &str| {
        url.split_once("://")
            .map(|(_, rest)| rest.split(['/', ':']).next().unwrap_or("").to_string())
            .unwrap()
    };
    let mut hosts: Vec<String> = vec![host(&config.forge.api_url)];
    if config.model.provider != gitops_loop::bosun::config::ModelProvider::None {
        hosts.push(host(config.model.base_url.as_deref().unwrap()));
    }
    if config.release_notes.enabled {
        hosts.extend(config.release_notes.allowed_hosts());
    }
    hosts.sort();
    hosts.dedup();
    hosts
}

/// The hosts a NetworkPolicy's annotation names.
fn egress_hosts(policy: &Value) -> Vec<String> {
    policy["metadata"]["annotations"]["bosun.gitops-loop.dev/egress-hosts"]
        .as_str()
        .unwrap()
        .split(',')
        .map(String::from)
        .collect()
}

fn network_policy(rendered: &[Value]) -> &Value {
    rendered
        .iter()
        .find(|o| o["kind"] == "NetworkPolicy")
        .expect("a NetworkPolicy by default")
}

#[test]
fn by_default_the_chart_grants_nothing_and_reads_the_inventory_from_argo_cds_api() {
    let rendered = objects(&[]);
    // No Kubernetes permission at all: no Role, ClusterRole or binding.
    assert_eq!(grants(&rendered), Vec::<Value>::new());
    assert!(
        !rendered
            .iter()
            .any(|o| o["kind"].as_str().is_some_and(|k| k.ends_with("Binding"))),
        "a binding with nothing to bind"
    );
    let config_map = rendered.iter().find(|o| o["kind"] == "ConfigMap").unwrap();
    let text = config_map["data"]["bosun.yaml"].as_str().unwrap();
    let config = gitops_loop::bosun::config::Config::parse(text, "bosun.yaml").unwrap();
    assert!(matches!(
        config.inventory,
        gitops_loop::bosun::config::InventoryConfig::Argocd { ref server, ref token_env }
            if server == "https://argocd-server.argocd.svc" && token_env == "ARGOCD_AUTH_TOKEN"
    ));
    let deployment = rendered.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap();
    assert_eq!(
        env.iter()
            .find(|e| e["name"] == "ARGOCD_AUTH_TOKEN")
            .map(|e| e["valueFrom"]["secretKeyRef"].clone()),
        Some(json!({"name": "bosun-argocd", "key": "token"}))
    );
    // Egress: DNS, Argo CD's API server pods, and HTTPS out of the cluster; nothing else.
    let policy = network_policy(&rendered);
    assert_eq!(
        policy["spec"],
        json!({
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "bosun", "app.kubernetes.io/instance": "bosun"}},
            "policyTypes": ["Egress"],
            "egress": [
                {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                         "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                 "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
                {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "argocd"}},
                         "podSelector": {"matchLabels": {"app.kubernetes.io/name": "argocd-server"}}}],
                 "ports": [{"protocol": "TCP", "port": 8080}]},
                {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]}}],
                 "ports": [{"protocol": "TCP", "port": 443}]}
            ]
        })
    );
    // The hosts it names are the ones the program would call with that config.
    let hosts = egress_hosts(policy);
    assert_eq!(hosts, program_hosts(&config));
}

#[test]
fn the_egress_follows_the_urls_bosun_reads_and_cluster_secrets_are_an_explicit_opt_in() {
    let rendered = objects(&[
        "--set",
        "config.forge.kind=gitea",
        "--set",
        "config.forge.apiUrl=https://gitea.example.test:3000/api/v1",
        "--set",
        "config.model.provider=openai",
        "--set",
        "config.model.baseUrl=http://llm.example.test:8000/v1",
        "--set",
        "config.model.model=local",
        "--set",
        "config.releaseNotes.enabled=false",
        "--set",
        "inventory.source=clusterSecrets",
        "--set",
        "networkPolicy.apiServer.cidrs[0]=192.0.2.10/32",
    ]);
    // Opted in: get/list on Secrets in Argo CD's namespace, and nothing else.
    assert_eq!(
        grants(&rendered),
        vec![json!({"kind": "Role", "namespace": "argocd",
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}]})]
    );
    let config_map = rendered.iter().find(|o| o["kind"] == "ConfigMap").unwrap();
    let config = gitops_loop::bosun::config::Config::parse(
        config_map["data"]["bosun.yaml"].as_str().unwrap(),
        "bosun.yaml",
    )
    .unwrap();
    assert!(
        matches!(config.inventory, gitops_loop::bosun::config::InventoryConfig::Kubernetes { ref namespace } if namespace == "argocd")
    );
    let policy = network_policy(&rendered);
    let egress = policy["spec"]["egress"].as_array().unwrap();
    assert_eq!(
        egress[1],
        json!({"to": [{"ipBlock": {"cidr": "192.0.2.10/32"}}],
               "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]})
    );
    assert_eq!(
        egress[2]["ports"],
        json!([{"protocol": "TCP", "port": 3000}, {"protocol": "TCP", "port": 8000}])
    );
    let hosts = egress_hosts(policy);
    assert_eq!(hosts, program_hosts(&config));
    assert_eq!(hosts, ["gitea.example.test", "llm.example.test"]);
    // Off, there is none.
    let rendered = objects(&["--set", "networkPolicy.enabled=false"]);
    assert!(!rendered.iter().any(|o| o["kind"] == "NetworkPolicy"));
}

#[test]
fn the_config_is_one_bosun_reads() {
    let rendered = objects(&[]);
    let config_map = rendered.iter().find(|o| o["kind"] == "ConfigMap").unwrap();
    let text = config_map["data"]["bosun.yaml"].as_str().unwrap();
    let config = gitops_loop::bosun::config::Config::parse(text, "bosun.yaml").unwrap();
    assert_eq!(config.forge.token_env, "BOSUN_FORGE_TOKEN");
    assert_eq!(config.webhook.secret_env, "BOSUN_WEBHOOK_SECRET");
    assert_eq!(
        config.workdir.as_deref(),
        Some(std::path::Path::new("/var/lib/bosun"))
    );

    let deployment = rendered.iter().find(|o| o["kind"] == "Deployment").unwrap();
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert_eq!(deployment["spec"]["strategy"]["type"], "Recreate");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let env = container["env"].as_array().unwrap();
    let secret_of = |name: &str| {
        env.iter()
            .find(|e| e["name"] == name)
            .map(|e| e["valueFrom"]["secretKeyRef"].clone())
            .unwrap()
    };
    assert_eq!(
        secret_of("BOSUN_FORGE_TOKEN"),
        json!({"name": "bosun-forge", "key": "token"})
    );
    assert_eq!(
        secret_of("BOSUN_WEBHOOK_SECRET"),
        json!({"name": "bosun-webhook", "key": "secret"})
    );
    assert!(
        !env.iter()
            .any(|e| e["name"] == "BOSUN_GITLAB_WEBHOOK_TOKEN"),
        "no GitLab webhook token unless one is named"
    );
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    // With a read-only root, everything Bosun writes has a volume: its work folder and /tmp.
    let mounts: Vec<&str> = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["mountPath"].as_str())
        .collect();
    assert!(
        mounts.contains(&"/var/lib/bosun") && mounts.contains(&"/tmp"),
        "{mounts:?}"
    );
}

#[test]
fn two_replicas_and_a_config_that_moves_the_workdir_are_refused() {
    for args in [
        ["--set", "replicaCount=2"],
        ["--set", "config.workdir=/elsewhere"],
        ["--set", "config.inventory.file=/etc/clusters.yaml"],
        ["--set", "inventory.source=secrets"],
    ] {
        let output = template(&args);
        assert!(!output.status.success(), "{args:?} was accepted");
        assert!(
            String::from_utf8_lossy(&output.stderr)
                .contains("values don't meet the specifications")
        );
    }
}

/// The pod can make the network namespace renders run in (a user namespace of its own, a
/// seccomp profile that allows unshare); without it, rendering unconfined is an explicit
/// opt-in that reaches bosun.yaml.
#[test]
fn the_pod_can_confine_renders_and_rendering_unconfined_is_an_explicit_opt_in() {
    let pod = |rendered: &[Value]| {
        rendered.iter().find(|o| o["kind"] == "Deployment").unwrap()["spec"]["template"]["spec"]
            .clone()
    };
    let config = |rendered: &[Value]| {
        let config_map = rendered.iter().find(|o| o["kind"] == "ConfigMap").unwrap();
        gitops_loop::bosun::config::Config::parse(
            config_map["data"]["bosun.yaml"].as_str().unwrap(),
            "bosun.yaml",
        )
        .unwrap()
    };
    let rendered = objects(&[]);
    let spec = pod(&rendered);
    assert_eq!(spec["hostUsers"], false);
    let container = &spec["containers"][0]["securityContext"];
    assert_eq!(container["seccompProfile"], json!({"type": "Unconfined"}));
    assert_eq!(container["allowPrivilegeEscalation"], false);
    assert_eq!(container["capabilities"], json!({"drop": ["ALL"]}));
    assert!(container.get("appArmorProfile").is_none(), "{container}");
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    assert!(!config(&rendered).render.allow_unconfined);

    // A Localhost profile and an AppArmor profile reach the container as given.
    let rendered = objects(&[
        "--set",
        "confinement.seccompProfile.type=Localhost",
        "--set",
        "confinement.seccompProfile.localhostProfile=profiles/unshare.json",
        "--set",
        "confinement.appArmorProfile.type=Localhost",
        "--set",
        "confinement.appArmorProfile.localhostProfile=bosun-userns",
    ]);
    let container = &pod(&rendered)["containers"][0]["securityContext"];
    assert_eq!(
        container["seccompProfile"],
        json!({"type": "Localhost", "localhostProfile": "profiles/unshare.json"})
    );
    assert_eq!(
        container["appArmorProfile"],
        json!({"type": "Localhost", "localhostProfile": "bosun-userns"})
    );

    // Where the cluster has no user namespaces: the pod keeps the runtime's default profile,
    // and renders run unconfined only when that is said.
    let rendered = objects(&[
        "--set",
        "confinement.userNamespaces=false",
        "--set",
        "confinement.allowUnconfined=true",
    ]);
    let spec = pod(&rendered);
    assert!(spec.get("hostUsers").is_none(), "{spec}");
    assert!(
        spec["containers"][0]["securityContext"]
            .get("seccompProfile")
            .is_none()
    );
    assert_eq!(
        spec["securityContext"]["seccompProfile"],
        json!({"type": "RuntimeDefault"})
    );
    assert!(config(&rendered).render.allow_unconfined);
}

/// Issue 31: Bosun on GitLab from the chart: the config it renders is one Bosun reads as a
/// GitLab forge, and the merge request webhook's token comes from the Secret named.
#[test]
fn on_gitlab_the_config_names_gitlab_and_the_webhook_token_comes_from_its_secret() {
    let rendered = objects(&[
        "--set",
        "config.forge.kind=gitlab",
        "--set",
        "config.forge.apiUrl=https://gitlab.example.com/api/v4",
        "--set",
        "config.forge.gitUrl=https://oauth2:{token}@gitlab.example.com/{slug}.git",
        "--set",
        "gitlabWebhook.secretName=bosun-gitlab-webhook",
    ]);
    let config_map = rendered.iter().find(|o| o["kind"] == "ConfigMap").unwrap();
    let text = config_map["data"]["bosun.yaml"].as_str().unwrap();
    let config = gitops_loop::bosun::config::Config::parse(text, "bosun.yaml").unwrap();
    assert_eq!(config.forge.kind, gitops_loop::forge::ForgeKind::Gitlab);
    assert_eq!(
        config.webhook.gitlab_token_env,
        "BOSUN_GITLAB_WEBHOOK_TOKEN"
    );
    let deployment = rendered.iter().find(|o| o["kind"] == "Deployment").unwrap();
    let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap();
    let token = env
        .iter()
        .find(|e| e["name"] == "BOSUN_GITLAB_WEBHOOK_TOKEN")
        .expect("the GitLab webhook token");
    assert_eq!(
        token["valueFrom"]["secretKeyRef"],
        json!({"name": "bosun-gitlab-webhook", "key": "token"})
    );
}
