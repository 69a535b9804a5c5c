//! Kargo behaviour on the API double, each test citing the upstream behaviour it models
//! (Kargo v1.11.2; `[K path]` as in the project's reference sheet).

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

use ground::kargo::{self, Kargo};
use ground::kube::store::{PatchBody, Resource, Selector, User};
use ground::kube::{FaultPlan, KubeDouble};
use ground::transcript::Transcript;
use serde_json::{Value, json};

const NS: &str = "kargo-demo";

fn crds() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../kind/crds")
}

fn user(name: &str) -> User {
    User {
        name: name.into(),
        groups: vec!["system:authenticated".into()],
    }
}

fn resource(kube: &KubeDouble, plural: &str) -> Resource {
    kube.store()
        .resource(kargo::GROUP, kargo::VERSION, plural)
        .cloned()
        .unwrap()
}

/// Creates an object (the resource is resolved first: the store's lock is not reentrant).
fn create(
    kube: &KubeDouble,
    plural: &str,
    object: Value,
    who: &User,
) -> Result<Value, ground::kube::store::ApiError> {
    let r = resource(kube, plural);
    kube.store().create(&r, NS, object, who)
}

struct World {
    /// What the last `promote_through` settled to say.
    said: String,
    kube: KubeDouble,
    kargo: Kargo,
    freights: Vec<String>,
    _dir: tempfile::TempDir,
}

/// A Project with one Warehouse, Freight for versions 1.0.0..=count, and a Stage `prod` whose
/// only step is compose-output (so a promotion succeeds at once).
async fn world(count: usize, auto: bool) -> World {
    let kube = KubeDouble::start(FaultPlan::none()).await.unwrap();
    kube.load_crds(&crds()).unwrap();
    kube.create_namespace(NS, &[(kargo::PROJECT_LABEL, "true")])
        .unwrap();
    kube.create_namespace("plain", &[]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kargo = Kargo::new(NS, dir.path(), "http://127.0.0.1:1", "token");
    kargo::install_webhooks(&kube, kargo.grants.clone());
    kargo.grants.allow("alice", NS, "prod");
    let admin = user("system:admin");
    let stage = json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Stage", "metadata": {"name": "prod", "annotations": if auto { json!({kargo::AUTO_PROMOTION_ANNOTATION: "true"}) } else { json!({}) }},
        "spec": {"requestedFreight": [{"origin": {"kind": "Warehouse", "name": "charts"}, "sources": {"direct": true}}],
                 "promotionTemplate": {"spec": {"vars": [{"name": "v", "value": "1"}], "steps": [{"uses": "compose-output", "config": {"done": true}}]}}}});
    create(&kube, "stages", stage, &admin).unwrap();
    let mut freights = Vec::new();
    for i in 0..count {
        let freight = json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Freight", "metadata": {"name": "client-chosen"},
            "origin": {"kind": "Warehouse", "name": "charts"}, "charts": [{"repoURL": "https://charts.example.test/stable", "name": "c", "version": format!("1.0.{i}")}]});
        let created = create(&kube, "freights", freight, &admin).unwrap();
        freights.push(created["metadata"]["name"].as_str().unwrap().to_string());
        // Kargo orders Freight by discovery time (then name): one second apart, as a
        // Warehouse's discoveries are.
        kube.clock().advance(ground::clock::TICK);
    }
    World {
        said: String::new(),
        kube,
        kargo,
        freights,
        _dir: dir,
    }
}

fn promotion(freight: &str) -> Value {
    json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Promotion", "metadata": {"generateName": "prod-"}, "spec": {"stage": "prod", "freight": freight, "steps": [{"uses": "noop"}]}})
}

async fn settle(world: &mut World) -> String {
    let transcript = Transcript::default();
    for _ in 0..20 {
        // As the ground's tick: one step of simulated time, then Kargo's round.
        world.kube.clock().advance(ground::clock::TICK);
        if !world.kargo.tick(&world.kube, &transcript).await && !world.kargo.busy() {
            break;
        }
    }
    transcript.text()
}

fn get(kube: &KubeDouble, plural: &str, name: &str) -> Value {
    let r = resource(kube, plural);
    kube.store().get(&r, NS, name).unwrap()
}

#[tokio::test]
async fn freight_names_are_content_hashes_set_by_the_webhook() {
    // [K pkg/api/freight.go; pkg/webhook/kubernetes/freight/webhook.go]: the webhook recomputes
    // the name on every create; a client-chosen name is overwritten. Aliases get a label.
    let world = world(1, false).await;
    let name = &world.freights[0];
    assert_eq!(name.len(), 40);
    assert_ne!(name, "client-chosen");
    let freight = get(&world.kube, "freights", name);
    let alias = freight["alias"].as_str().unwrap();
    assert_eq!(
        freight["metadata"]["labels"][kargo::ALIAS_LABEL],
        json!(alias)
    );
    // Artifacts are immutable after creation.
    let r = resource(&world.kube, "freights");
    let err = world
        .kube
        .store()
        .patch(
            &r,
            NS,
            name,
            PatchBody::Merge(json!({"charts": []})),
            &user("system:admin"),
            false,
        )
        .unwrap_err();
    assert_eq!(err.code, 422);
}

#[tokio::test]
async fn promotion_webhook_replaces_the_name_and_copies_the_steps() {
    // [K pkg/webhook/kubernetes/promotion/webhook.go; pkg/api/promotion.go]: name
    // <stage>.<ulid>.<freight7>; label kargo.akuity.io/stage; steps and vars from the Stage;
    // create-actor annotation; owner reference to the Stage.
    let world = world(1, false).await;
    let created = create(
        &world.kube,
        "promotions",
        promotion(&world.freights[0]),
        &user("alice"),
    )
    .unwrap();
    let name = created["metadata"]["name"].as_str().unwrap();
    let parts: Vec<&str> = name.split('.').collect();
    assert_eq!(parts.len(), 3, "{name}");
    assert_eq!(parts[0], "prod");
    assert_eq!(parts[1].len(), 26);
    assert_eq!(parts[2], &world.freights[0][..7]);
    assert_eq!(
        created["metadata"]["labels"][kargo::STAGE_LABEL],
        json!("prod")
    );
    assert_eq!(
        created["metadata"]["annotations"][kargo::CREATE_ACTOR_ANNOTATION],
        json!("kubernetes:alice")
    );
    assert_eq!(
        created["spec"]["steps"],
        json!([{"uses": "compose-output", "config": {"done": true}}])
    );
    assert_eq!(
        created["spec"]["vars"],
        json!([{"name": "v", "value": "1"}])
    );
    assert_eq!(
        created["metadata"]["ownerReferences"][0]["kind"],
        json!("Stage")
    );
}

#[tokio::test]
async fn the_promote_verb_is_checked_for_create_and_delete() {
    // [K pkg/webhook/kubernetes/promotion/webhook.go]: a SubjectAccessReview for `promote` on
    // the Stage, for create, update and delete; `create` on promotions is not enough. The
    // Forbidden comes back wrapped in an internal error (HTTP 500), as ValidateCreate wraps it.
    let world = world(1, false).await;
    let r = resource(&world.kube, "promotions");
    let err = world
        .kube
        .store()
        .create(&r, NS, promotion(&world.freights[0]), &user("mallory"))
        .unwrap_err();
    assert_eq!((err.code, err.reason.as_str()), (500, "InternalError"));
    assert!(
        err.message.contains("Internal error occurred: promotions.kargo.akuity.io")
            && err
                .message
                .contains("is forbidden: subject \"mallory\" is not permitted to create Promotions for Stage \"prod\""),
        "{}",
        err.message
    );
    let created = world
        .kube
        .store()
        .create(&r, NS, promotion(&world.freights[0]), &user("alice"))
        .unwrap();
    let name = created["metadata"]["name"].as_str().unwrap();
    let err = world
        .kube
        .store()
        .delete(&r, NS, name, &user("mallory"))
        .unwrap_err();
    assert_eq!(err.code, 500);
    assert!(
        err.message.contains("not permitted to delete Promotions"),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn unavailable_or_missing_freight_and_non_project_namespaces_are_refused() {
    // [K api/v1alpha1/stage_types.go IsFreightAvailable; pkg/webhook/kubernetes/promotion/
    // webhook.go]: missing or unavailable Freight and a missing Stage are Invalid (422).
    let world = world(1, false).await;
    let r = resource(&world.kube, "promotions");
    let missing = world
        .kube
        .store()
        .create(
            &r,
            NS,
            promotion("0000000000000000000000000000000000000000"),
            &user("alice"),
        )
        .unwrap_err();
    assert_eq!((missing.code, missing.reason.as_str()), (422, "Invalid"));
    let no_stage = json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Promotion", "metadata": {"generateName": "x-"},
        "spec": {"stage": "nowhere", "freight": world.freights[0], "steps": [{"uses": "noop"}]}});
    let no_stage = create(&world.kube, "promotions", no_stage, &user("alice")).unwrap_err();
    assert_eq!(no_stage.code, 422);
    assert!(
        no_stage
            .message
            .contains("spec.stage: Invalid value: \"nowhere\": could not find Stage"),
        "{}",
        no_stage.message
    );
    let admin = user("system:admin");
    let other = json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Freight", "metadata": {"name": "x"},
        "origin": {"kind": "Warehouse", "name": "elsewhere"}, "images": [{"repoURL": "r", "tag": "t", "digest": "d"}]});
    let other = create(&world.kube, "freights", other, &admin).unwrap();
    let unavailable = world
        .kube
        .store()
        .create(
            &r,
            NS,
            promotion(other["metadata"]["name"].as_str().unwrap()),
            &user("alice"),
        )
        .unwrap_err();
    assert_eq!(unavailable.code, 422);
    assert!(
        unavailable.message.contains("spec.freight: Invalid value:")
            && unavailable
                .message
                .contains("Freight is not available to this Stage"),
        "{}",
        unavailable.message
    );
}

#[tokio::test]
async fn phases_and_stage_status_follow_kargo() {
    // [K api/v1alpha1/promotion_types.go; pkg/controller/promotions]: "" until the controller
    // marks it Pending, then Running, then terminal. [K pkg/controller/stages/regular_stages.go]:
    // a Succeeded Promotion prepends freightHistory (items keyed Warehouse/<name>, max 10) and
    // sets lastPromotion; the Freight is currentlyIn the Stage.
    let mut world = world(11, false).await;
    let r = resource(&world.kube, "promotions");
    let first = world
        .kube
        .store()
        .create(&r, NS, promotion(&world.freights[0]), &user("alice"))
        .unwrap();
    assert_eq!(
        first.pointer("/status/phase"),
        None,
        "a new Promotion has an empty phase"
    );
    settle(&mut world).await;
    let done = get(
        &world.kube,
        "promotions",
        first["metadata"]["name"].as_str().unwrap(),
    );
    assert_eq!(done["status"]["phase"], json!("Succeeded"));
    let stage = get(&world.kube, "stages", "prod");
    assert_eq!(
        stage["status"]["freightHistory"][0]["items"]["Warehouse/charts"]["name"],
        json!(world.freights[0])
    );
    assert_eq!(
        stage["status"]["lastPromotion"]["status"]["phase"],
        json!("Succeeded")
    );
    assert_eq!(stage["status"]["currentPromotion"], Value::Null);
    let freight = get(&world.kube, "freights", &world.freights[0]);
    assert!(freight["status"]["currentlyIn"]["prod"].is_object());
    for freight in world.freights.clone().iter().skip(1) {
        world
            .kube
            .store()
            .create(&r, NS, promotion(freight), &user("alice"))
            .unwrap();
        settle(&mut world).await;
    }
    let stage = get(&world.kube, "stages", "prod");
    let history = stage["status"]["freightHistory"].as_array().unwrap();
    assert_eq!(history.len(), 10, "freightHistory keeps 10 entries");
    assert_eq!(
        history[0]["items"]["Warehouse/charts"]["name"],
        json!(world.freights[10])
    );
    let first_freight = get(&world.kube, "freights", &world.freights[0]);
    assert!(
        first_freight["status"]["currentlyIn"].get("prod").is_none(),
        "the previous Freight leaves the Stage"
    );
}

#[tokio::test]
async fn a_failed_promotion_changes_last_promotion_not_the_history() {
    // Reference sheet gotcha 1: only Succeeded Promotions add history entries.
    let mut world = world(2, false).await;
    let r = resource(&world.kube, "promotions");
    world
        .kube
        .store()
        .create(&r, NS, promotion(&world.freights[0]), &user("alice"))
        .unwrap();
    settle(&mut world).await;
    world.kargo.failing_stages.push("prod".into());
    world
        .kube
        .store()
        .create(&r, NS, promotion(&world.freights[1]), &user("alice"))
        .unwrap();
    settle(&mut world).await;
    let stage = get(&world.kube, "stages", "prod");
    assert_eq!(
        stage["status"]["lastPromotion"]["status"]["phase"],
        json!("Failed")
    );
    assert_eq!(
        stage["status"]["freightHistory"].as_array().unwrap().len(),
        1
    );
    assert_eq!(
        stage["status"]["freightHistory"][0]["items"]["Warehouse/charts"]["name"],
        json!(world.freights[0])
    );
}

#[tokio::test]
async fn user_promotions_hold_or_resume_auto_promotion() {
    // [K pkg/webhook/kubernetes/promotion/webhook.go] (v1.11): for a user-initiated Promotion on
    // a Stage with auto-promotion, hold the origin unless it promotes the newest Freight.
    let world = world(2, true).await;
    let r = resource(&world.kube, "promotions");
    let older = world
        .kube
        .store()
        .create(&r, NS, promotion(&world.freights[0]), &user("alice"))
        .unwrap();
    assert_eq!(
        older["metadata"]["annotations"][kargo::HOLD_ANNOTATION],
        json!("Warehouse/charts")
    );
    let newest = world
        .kube
        .store()
        .create(&r, NS, promotion(&world.freights[1]), &user("alice"))
        .unwrap();
    assert_eq!(
        newest["metadata"]["annotations"][kargo::RESUME_ANNOTATION],
        json!("Warehouse/charts")
    );
    // The controller's own Promotions carry neither.
    let list = world.kube.store().list(
        &r,
        NS,
        &Selector::parse("kargo.akuity.io/stage=prod").unwrap(),
        &Selector::default(),
    );
    assert_eq!(list.len(), 2);
}

#[tokio::test]
async fn the_crds_cel_rules_refuse_what_the_api_server_refuses() {
    // [kube apiextensions-apiserver: x-kubernetes-validations run on every write; Kargo's
    // Stage CRD: a promotion step sets exactly one of `uses` or `task`]. The rules run through
    // the product's CEL evaluator; the world's own Stage (one `uses` step) passed the same rule.
    let world = world(1, false).await;
    let admin = user("system:admin");
    let stage = json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Stage", "metadata": {"name": "both"},
        "spec": {"requestedFreight": [{"origin": {"kind": "Warehouse", "name": "charts"}, "sources": {"direct": true}}],
                 "promotionTemplate": {"spec": {"steps": [{"uses": "argocd-update", "task": {"name": "t"}}]}}}});
    let err = create(&world.kube, "stages", stage, &admin).unwrap_err();
    assert_eq!(err.code, 422, "{err:?}");
    assert!(
        err.message.contains("exactly one of uses or task"),
        "{}",
        err.message
    );
}

/// A Stage `held` whose template is `steps`, and a Promotion of the first Freight to it; the
/// Promotion after the controller settled.
async fn promote_through(world: &mut World, steps: Value) -> Value {
    let admin = user("system:admin");
    let stage = json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Stage", "metadata": {"name": "held"},
        "spec": {"requestedFreight": [{"origin": {"kind": "Warehouse", "name": "charts"}, "sources": {"direct": true}}],
                 "promotionTemplate": {"spec": {"steps": steps}}}});
    create(&world.kube, "stages", stage, &admin).unwrap();
    world.kargo.grants.allow("alice", NS, "held");
    let promotion = json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Promotion", "metadata": {"generateName": "held-"},
        "spec": {"stage": "held", "freight": world.freights[0], "steps": [{"uses": "compose-output", "config": {"x": 1}}]}});
    let created = create(&world.kube, "promotions", promotion, &user("alice")).unwrap();
    world.said = settle(world).await;
    get(
        &world.kube,
        "promotions",
        created["metadata"]["name"].as_str().unwrap(),
    )
}

#[tokio::test]
async fn an_unreachable_http_endpoint_errors_the_promotion_unless_retry_allows_it() {
    // [K pkg/promotion/runner/builtin/http_requester.go]: a request that cannot be sent is
    // Errored with a recoverable error; [K pkg/promotion/local_orchestrator.go]: it ends the
    // Promotion once `retry.errorThreshold` (default 1) consecutive errors are reached.
    let http = |retry: Value| {
        let mut step = json!({"uses": "http", "as": "bosun", "config": {"method": "POST",
            "url": "http://127.0.0.1:1/intake", "body": "{}"}});
        if !retry.is_null() {
            step["retry"] = retry;
        }
        json!([step])
    };
    let mut world = world(1, false).await;
    let done = promote_through(&mut world, http(Value::Null)).await;
    assert_eq!(done["status"]["phase"], json!("Errored"), "{done}");
    let message = done["status"]["message"].as_str().unwrap();
    assert!(message.contains("error threshold of 1"), "{message}");

    let mut world = self::world(1, false).await;
    let done = promote_through(&mut world, http(json!({"errorThreshold": 3}))).await;
    assert_eq!(done["status"]["phase"], json!("Errored"), "{done}");
    let message = done["status"]["message"].as_str().unwrap();
    assert!(message.contains("error threshold of 3"), "{message}");
}

#[tokio::test]
async fn a_json_looking_template_becomes_an_object_and_fails_the_step_schema() {
    // [K pkg/expressions/json_templates.go]: an evaluated string that parses as JSON becomes
    // that value; the http step's config schema wants a string body, so the step fails
    // terminally and the Promotion Fails. Quoting the whole object keeps it a string
    // (docs/bosun.md gives this form).
    let unquoted = json!([{"uses": "http", "config": {"method": "POST", "url": "http://127.0.0.1:1/intake",
        "body": "{\"stage\": \"${{ ctx.stage }}\"}"}}]);
    let mut world = world(1, false).await;
    let done = promote_through(&mut world, unquoted).await;
    assert_eq!(done["status"]["phase"], json!("Failed"), "{done}");
    let message = done["status"]["message"].as_str().unwrap();
    assert!(
        message.contains("invalid http config") && message.contains("/body"),
        "{message}"
    );

    let quoted = json!([{"uses": "http", "config": {"method": "POST", "url": "http://127.0.0.1:1/intake",
        "body": "${{ quote({\"stage\": ctx.stage}) }}"}}]);
    let mut world = self::world(1, false).await;
    let done = promote_through(&mut world, quoted).await;
    let message = done["status"]["message"].as_str().unwrap();
    assert!(!message.contains("invalid http config"), "{message}");
    assert!(message.contains("error sending HTTP request"), "{message}");
}

#[tokio::test]
async fn steps_are_aliased_from_one_and_an_if_condition_skips_them() {
    // [K api/v1alpha1/promotion_types.go GetAlias]: `step-<i+1>`; [K pkg/promotion/evaluator.go
    // ShouldSkip]: a false `if:` skips the step, a non-bool one errors.
    let steps = json!([
        {"uses": "compose-output", "config": {"n": 1}},
        {"uses": "compose-output", "if": "${{ outputs['step-1'].n == 2 }}", "config": {"n": 2}},
        {"uses": "compose-output", "if": "${{ status('step-2') == 'Skipped' }}", "config": {"n": "${{ outputs['step-1'].n + 2 }}"}},
        {"uses": "compose-output", "if": "${{ outputs['step-3'].n }}", "config": {"n": 4}}
    ]);
    let mut world = world(1, false).await;
    let done = promote_through(&mut world, steps).await;
    assert_eq!(done["status"]["phase"], json!("Errored"), "{done}");
    let message = done["status"]["message"].as_str().unwrap();
    assert!(message.starts_with("step 4"), "{message}");
    assert!(message.contains("must evaluate to a boolean"), "{message}");
}

/// Creates Argo CD's `argocd` namespace; returns the Applications resource.
fn argocd_namespace(world: &World) -> Resource {
    world.kube.create_namespace("argocd", &[]).unwrap();
    world
        .kube
        .store()
        .resource("argoproj.io", "v1alpha1", "applications")
        .cloned()
        .unwrap()
}

/// The Application `web` in `argocd`: chart `web` from `repo` at 1.0.0, with the
/// authorized-stage annotation when given.
fn web_app(authorized: Option<&str>, repo: &str) -> Value {
    let mut object = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": "web", "namespace": "argocd"},
        "spec": {"project": "default", "destination": {"server": "https://kubernetes.default.svc"},
                 "source": {"repoURL": repo, "chart": "web", "targetRevision": "1.0.0"}}});
    if let Some(a) = authorized {
        object["metadata"]["annotations"] = json!({"kargo.akuity.io/authorized-stage": a});
    }
    object
}

const CHARTS: &str = "https://charts.example.test/stable";

#[tokio::test]
async fn argocd_update_refuses_a_missing_or_unauthorizing_application_and_starts_a_sync() {
    // [K pkg/promotion/runner/builtin/argocd_updater.go]: the Application must exist and its
    // kargo.akuity.io/authorized-stage annotation must name <project>:<stage>; then a sync
    // operation is started, initiated by kargo-controller, its info naming the Promotion.
    let admin = user("system:admin");
    let step = |app: &str| json!([{"uses": "argocd-update", "config": {"apps": [{"name": app}]}}]);
    let cases = [
        (
            None,
            "unable to find Argo CD Application \"web\" in namespace \"argocd\"",
        ),
        (
            Some(web_app(None, CHARTS)),
            "does not permit mutation by Kargo Stage held",
        ),
        (
            Some(web_app(Some("kargo-demo:prod"), CHARTS)),
            "does not permit mutation by Kargo Stage held",
        ),
        (
            Some(web_app(Some("kargo-demo:*"), CHARTS)),
            "unable to parse value of annotation",
        ),
    ];
    for (application, expected) in cases {
        let mut world = world(1, false).await;
        let r = argocd_namespace(&world);
        if let Some(application) = application {
            world
                .kube
                .store()
                .create(&r, "argocd", application, &admin)
                .unwrap();
        }
        let done = promote_through(&mut world, step("web")).await;
        assert_eq!(done["status"]["phase"], json!("Errored"), "{done}");
        let message = done["status"]["message"].as_str().unwrap();
        assert!(message.contains(expected), "{message}");
    }
    let mut world = world(1, false).await;
    let r = argocd_namespace(&world);
    world
        .kube
        .store()
        .create(
            &r,
            "argocd",
            web_app(Some("other:x, kargo-demo:held"), CHARTS),
            &admin,
        )
        .unwrap();
    let running = promote_through(&mut world, step("web")).await;
    assert_eq!(running["status"]["phase"], json!("Running"), "{running}");
    let synced = world.kube.store().get(&r, "argocd", "web").unwrap();
    assert_eq!(
        synced["operation"]["initiatedBy"]["username"],
        json!("kargo-controller")
    );
    assert_eq!(
        synced["operation"]["info"][1],
        json!({"name": "Promotion", "value": running["metadata"]["name"]})
    );
}

#[tokio::test]
async fn a_later_resume_lifts_an_earlier_hold() {
    // [K pkg/controller/stages/regular_stages.go]: the newest non-Aborted Promotion with a
    // hold or resume intent decides; the README's "resume by promoting the newest Freight".
    let mut world = world(2, true).await;
    let r = resource(&world.kube, "promotions");
    let admin = user("system:admin");
    let auto_promotions = |world: &World| {
        world
            .kube
            .store()
            .list(&r, NS, &Selector::default(), &Selector::default())
            .into_iter()
            .filter(|p| p["metadata"]["annotations"]["kargo.akuity.io/create-actor"].is_null())
            .count()
    };
    world
        .kube
        .store()
        .create(&r, NS, promotion(&world.freights[0]), &user("alice"))
        .unwrap();
    settle(&mut world).await;
    let publish = |world: &World, version: &str| {
        let freight = json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Freight", "metadata": {"name": "x"},
            "origin": {"kind": "Warehouse", "name": "charts"}, "charts": [{"repoURL": "https://charts.example.test/stable", "name": "c", "version": version}]});
        create(&world.kube, "freights", freight, &admin).unwrap()["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let held_over = publish(&world, "1.0.5");
    settle(&mut world).await;
    assert_eq!(auto_promotions(&world), 0, "a hold stops auto-promotion");
    world
        .kube
        .store()
        .create(&r, NS, promotion(&held_over), &user("alice"))
        .unwrap();
    settle(&mut world).await;
    publish(&world, "1.0.6");
    settle(&mut world).await;
    assert_eq!(auto_promotions(&world), 1, "the resume lifted the hold");
}

#[tokio::test]
async fn after_a_failure_only_steps_whose_if_allows_it_run_and_the_first_failure_decides() {
    // [K pkg/promotion/local_orchestrator.go; evaluator.go ShouldSkip]: the run goes on after
    // a failed step; a step without `if:` is skipped, one with `if:` is evaluated (an explicit
    // `if:` drops the implicit success(): `always()` runs, `success()` does not).
    let steps = json!([
        {"uses": "http", "as": "bosun", "config": {"method": "POST", "url": "http://127.0.0.1:1/intake", "body": "{}"}},
        {"uses": "compose-output", "as": "plain", "config": {"n": 1}},
        {"uses": "compose-output", "as": "guarded", "if": "${{ success() }}", "config": {"n": 2}},
        {"uses": "compose-output", "as": "cleanup", "if": "${{ always() && status('bosun') == 'Errored' }}", "config": {"n": 3}}
    ]);
    let mut world = world(1, false).await;
    let done = promote_through(&mut world, steps).await;
    assert_eq!(done["status"]["phase"], json!("Errored"), "{done}");
    let message = done["status"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("step \"bosun\" met error threshold of 1: "),
        "{message}"
    );
    let said = &world.said;
    assert!(
        said.contains("step 2/4 compose-output: skipped (a step before it failed)"),
        "{said}"
    );
    assert!(
        said.contains("step 3/4 compose-output: skipped (its if: condition is false)"),
        "{said}"
    );
    assert!(
        said.contains("step 4/4 compose-output: outputs composed"),
        "{said}"
    );
}

#[tokio::test]
async fn retry_timeout_worst_phase_and_unmatched_argocd_sources() {
    // [K pkg/promotion/local_orchestrator.go]: a step still erroring past `retry.timeout`
    // Errors; the Promotion takes the worst step status (Errored over Failed).
    let steps = json!([
        {"uses": "yaml-update", "config": {"path": "x.yaml"}},
        {"uses": "http", "if": "${{ always() }}", "retry": {"errorThreshold": 1000, "timeout": "1ns"},
         "config": {"method": "POST", "url": "http://127.0.0.1:1/intake", "body": "{}"}}
    ]);
    let mut world = world(1, false).await;
    let done = promote_through(&mut world, steps).await;
    assert_eq!(done["status"]["phase"], json!("Errored"), "{done}");
    let message = done["status"]["message"].as_str().unwrap();
    assert!(
        message == "step \"step-2\" timed out after 1ns",
        "{message}"
    );

    // [K argocd_updater.go]: a source update that matches none of the Application's sources
    // Errors the step.
    let admin = user("system:admin");
    let mut world = self::world(1, false).await;
    let r = argocd_namespace(&world);
    // The Application's source has a trailing slash the update's repoURL lacks.
    let app = web_app(Some("kargo-demo:held"), &format!("{CHARTS}/"));
    world
        .kube
        .store()
        .create(&r, "argocd", app, &admin)
        .unwrap();
    let steps = json!([{"uses": "argocd-update", "config": {"apps": [{"name": "web",
        "sources": [{"repoURL": "https://charts.example.test/stable", "chart": "web", "desiredRevision": "1.0.1"}]}]}}]);
    let done = promote_through(&mut world, steps).await;
    assert_eq!(done["status"]["phase"], json!("Errored"), "{done}");
    let message = done["status"]["message"].as_str().unwrap();
    assert!(message.contains("matched update for source with repoURL https://charts.example.test/stable and chart \"web\""), "{message}");
}

#[tokio::test]
async fn argocd_update_syncs_again_until_the_desired_revision_runs() {
    // [K argocd_updater.go mustPerformUpdate]: a finished sync whose result is not the
    // desired revision is started again; the step completes once it is.
    let admin = user("system:admin");
    let mut world = world(1, false).await;
    let r = argocd_namespace(&world);
    let app = web_app(Some("kargo-demo:held"), CHARTS);
    world
        .kube
        .store()
        .create(&r, "argocd", app, &admin)
        .unwrap();
    let steps = json!([{"uses": "argocd-update", "config": {"apps": [{"name": "web",
        "sources": [{"repoURL": "https://charts.example.test/stable", "chart": "web", "desiredRevision": "1.0.1"}]}]}}]);
    let running = promote_through(&mut world, steps).await;
    let promotion = running["metadata"]["name"].as_str().unwrap().to_string();
    // Argo CD finishes the sync, but at the old chart version.
    let finish = |world: &World, revision: &str| {
        let mut app = world.kube.store().get(&r, "argocd", "web").unwrap();
        let operation = app["operation"].take();
        assert!(
            !operation.is_null(),
            "a sync operation was requested: {app}"
        );
        app.as_object_mut().unwrap().remove("operation");
        app["status"] = json!({"sync": {"status": "Synced", "revision": revision},
            "operationState": {"operation": operation, "phase": "Succeeded", "syncResult": {"revision": revision}}});
        world
            .kube
            .store()
            .update(&r, "argocd", "web", app, &admin, false)
            .unwrap();
    };
    finish(&world, "1.0.0");
    settle(&mut world).await;
    assert_eq!(
        get(&world.kube, "promotions", &promotion)["status"]["phase"],
        json!("Running")
    );
    finish(&world, "1.0.1");
    settle(&mut world).await;
    assert_eq!(
        get(&world.kube, "promotions", &promotion)["status"]["phase"],
        json!("Succeeded")
    );
}

#[tokio::test]
async fn an_oci_chart_subscription_names_no_chart_and_an_https_one_must() {
    // [K pkg/subscription/chart.go]: Kargo's Warehouse webhook refuses both mistakes.
    let world = world(1, false).await;
    let admin = user("system:admin");
    let warehouse = |repo: &str, name: &str| {
        json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Warehouse", "metadata": {"name": "w"},
            "spec": {"subscriptions": [{"chart": {"repoURL": repo, "name": name}}]}})
    };
    let err = create(
        &world.kube,
        "warehouses",
        warehouse("oci://ghcr.io/x/chart", "chart"),
        &admin,
    )
    .unwrap_err();
    assert_eq!(err.code, 422);
    assert!(
        err.message
            .contains("must be empty if repoURL starts with oci://"),
        "{}",
        err.message
    );
    let err = create(
        &world.kube,
        "warehouses",
        warehouse("https://charts.example.test", ""),
        &admin,
    )
    .unwrap_err();
    assert!(err.message.contains("must be non-empty"), "{}", err.message);
    create(
        &world.kube,
        "warehouses",
        warehouse("oci://ghcr.io/x/chart", ""),
        &admin,
    )
    .unwrap();
}

#[tokio::test]
async fn the_next_promotion_waits_while_the_current_freight_is_verified() {
    // [K pkg/controller/stages/regular_stages.go syncPromotions]: "current Freight has a
    // non-terminal verification: wait for it to complete before allowing new promotions to
    // start"; once the AnalysisRun is terminal, the next Promotion runs.
    let admin = user("system:admin");
    let mut world = world(2, false).await;
    let template = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisTemplate", "metadata": {"name": "healthy"},
        "spec": {"metrics": [{"name": "up", "successCondition": "result[0] == 1",
            "provider": {"prometheus": {"address": "http://127.0.0.1:1", "query": "vector(1)"}}}]}});
    let rollouts = |plural: &str| {
        world
            .kube
            .store()
            .resource("argoproj.io", "v1alpha1", plural)
            .cloned()
            .unwrap()
    };
    let templates = rollouts("analysistemplates");
    let runs = rollouts("analysisruns");
    world
        .kube
        .store()
        .create(&templates, NS, template, &admin)
        .unwrap();
    let stage = json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Stage", "metadata": {"name": "verified"},
        "spec": {"requestedFreight": [{"origin": {"kind": "Warehouse", "name": "charts"}, "sources": {"direct": true}}],
                 "promotionTemplate": {"spec": {"steps": [{"uses": "compose-output", "config": {"done": true}}]}},
                 "verification": {"analysisTemplates": [{"name": "healthy"}]}}});
    create(&world.kube, "stages", stage, &admin).unwrap();
    world.kargo.grants.allow("alice", NS, "verified");
    let promote = |world: &World, freight: &str| {
        let promotion = json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Promotion", "metadata": {"generateName": "verified-"},
            "spec": {"stage": "verified", "freight": freight, "steps": [{"uses": "noop"}]}});
        create(&world.kube, "promotions", promotion, &user("alice")).unwrap()["metadata"]["name"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let first = promote(&world, &world.freights[0].clone());
    let said = settle(&mut world).await;
    assert_eq!(
        get(&world.kube, "promotions", &first)["status"]["phase"],
        json!("Succeeded")
    );
    assert!(said.contains("verification started: AnalysisRun"), "{said}");
    let second = promote(&world, &world.freights[1].clone());
    let said = settle(&mut world).await;
    assert_eq!(
        get(&world.kube, "promotions", &second)["status"]["phase"],
        json!("Pending"),
        "{said}"
    );
    assert!(said.contains("is still being verified there"), "{said}");
    // The AnalysisRun finishes (the ground's Argo Rollouts is not running in this test).
    let run = world
        .kube
        .store()
        .list(&runs, NS, &Selector::default(), &Selector::default());
    assert_eq!(run.len(), 1, "one AnalysisRun: {run:?}");
    let name = run[0]["metadata"]["name"].as_str().unwrap().to_string();
    world
        .kube
        .store()
        .patch(
            &runs,
            NS,
            &name,
            PatchBody::Merge(json!({"status": {"phase": "Successful"}})),
            &admin,
            true,
        )
        .unwrap();
    let said = settle(&mut world).await;
    assert_eq!(
        get(&world.kube, "promotions", &second)["status"]["phase"],
        json!("Succeeded"),
        "{said}"
    );
}

/// A forge double that answers every REST request with a 500 (Kargo's GitHub client does not
/// retry): returns its URL.
async fn failing_forge() -> String {
    let app = axum::Router::new().fallback(|| async {
        (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            axum::Json(json!({"message": "Server Error (injected fault)"})),
        )
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

#[tokio::test]
async fn a_forge_error_in_git_open_pr_or_git_wait_for_pr_errors_the_promotion() {
    // [K pkg/promotion/runner/builtin/git_pr_opener.go, git_pr_waiter.go]: a forge error is a
    // recoverable error (Errored), and [K pkg/promotion/local_orchestrator.go] the default
    // `retry.errorThreshold` of 1 ends the Promotion Errored at the first one, its message the
    // step's: `step "<alias>" met error threshold of 1: <what failed>`. (The ground used to
    // wait through a 500 in git-wait-for-pr and Fail git-open-pr.)
    const REPO: &str = "https://git.example.test/platform/gitops.git";
    for (step, wanted) in [
        (
            json!({"uses": "git-open-pr", "as": "open", "config": {"repoURL": REPO, "sourceBranch": "kargo/x", "targetBranch": "main"}}),
            "step \"open\" met error threshold of 1: error determining if pull request already exists: error listing pull requests: GET ",
        ),
        (
            json!({"uses": "git-wait-for-pr", "as": "wait", "config": {"repoURL": REPO, "prNumber": 7}}),
            "step \"wait\" met error threshold of 1: error getting pull request 7: GET ",
        ),
    ] {
        let mut world = world(1, false).await;
        world.kargo.forge_url = failing_forge().await;
        world.kargo.git_repos.insert(
            REPO.to_string(),
            ("platform/gitops".to_string(), REPO.to_string()),
        );
        let done = promote_through(&mut world, json!([step])).await;
        assert_eq!(done["status"]["phase"], json!("Errored"), "{done}");
        let message = done["status"]["message"].as_str().unwrap();
        assert!(message.starts_with(wanted), "{message}");
        assert!(
            message.ends_with(": 500 Server Error (injected fault) []"),
            "{message}"
        );
    }
}

#[tokio::test]
async fn auto_promotion_takes_the_newest_freight_available_to_the_stage() {
    // [K pkg/controller/stages/regular_stages.go autoPromoteFreight; pkg/api/auto_promotion.go
    // SelectAutoPromotionCandidates; pkg/api/stage.go ListFreightAvailableToStage]: the
    // candidate is the newest Freight AVAILABLE to the Stage (here: verified upstream), not the
    // newest overall. The ground used to take the newest overall, find it unavailable and
    // promote nothing.
    let mut world = world(3, false).await;
    let admin = user("system:admin");
    let stage = json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Stage", "metadata": {"name": "downstream",
        "annotations": {kargo::AUTO_PROMOTION_ANNOTATION: "true"}},
        "spec": {"requestedFreight": [{"origin": {"kind": "Warehouse", "name": "charts"}, "sources": {"stages": ["prod"]}}],
                 "promotionTemplate": {"spec": {"steps": [{"uses": "compose-output", "config": {"done": true}}]}}}});
    create(&world.kube, "stages", stage, &admin).unwrap();
    let freights = resource(&world.kube, "freights");
    // The two older Freight are verified in prod; the newest is not.
    for name in &world.freights[..2] {
        world
            .kube
            .store()
            .patch(
                &freights,
                NS,
                name,
                PatchBody::Merge(json!({"status": {"verifiedIn": {"prod": {}}}})),
                &admin,
                true,
            )
            .unwrap();
    }
    settle(&mut world).await;
    let r = resource(&world.kube, "promotions");
    let promoted: Vec<String> = world
        .kube
        .store()
        .list(&r, NS, &Selector::default(), &Selector::default())
        .iter()
        .filter(|p| p["spec"]["stage"] == json!("downstream"))
        .map(|p| p["spec"]["freight"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(promoted, vec![world.freights[1].clone()], "{}", world.said);
    let stage = get(&world.kube, "stages", "downstream");
    assert_eq!(
        stage["status"]["freightHistory"][0]["items"]["Warehouse/charts"]["name"],
        json!(world.freights[1])
    );
}

#[tokio::test]
async fn a_semver_constraint_that_does_not_parse_yields_no_freight_and_or_ranges_are_read() {
    // [K pkg/subscription/chart.go, pkg/validation/validation.go]: the Warehouse webhook refuses
    // a constraint Masterminds/semver cannot parse; [K pkg/helm/chart/base_selector.go,
    // pkg/controller/warehouses/warehouses.go] discovery fails on one (the Warehouse is not
    // Healthy, no Freight). `||` and hyphen ranges are Masterminds syntax Kargo reads. (The
    // ground used to drop a bad constraint and take the newest version.)
    let warehouse = |constraint: &str| {
        json!({"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Warehouse", "metadata": {"name": "w"},
            "spec": {"subscriptions": [{"chart": {"repoURL": "https://charts.example.test/stable", "name": "c", "semverConstraint": constraint}}]}})
    };
    let admin = user("system:admin");
    let world = world(0, false).await;
    let err = create(&world.kube, "warehouses", warehouse("^1.2 ||"), &admin).unwrap_err();
    assert_eq!(err.code, 422);
    assert!(
        err.message
            .contains("spec.subscriptions[0].chart.semverConstraint: Invalid value: \"^1.2 ||\""),
        "{}",
        err.message
    );

    // Without the webhook (as for a Warehouse stored before it ran), discovery fails.
    let discover = |constraint: &'static str| {
        let object = warehouse(constraint);
        discover_with(object)
    };
    async fn discover_with(object: Value) -> (Vec<Value>, Value, String) {
        let admin = user("system:admin");
        let kube = KubeDouble::start(FaultPlan::none()).await.unwrap();
        kube.load_crds(&crds()).unwrap();
        kube.create_namespace(NS, &[(kargo::PROJECT_LABEL, "true")])
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut kargo = Kargo::new(NS, dir.path(), "http://127.0.0.1:1", "token");
        kargo.chart_versions = Box::new(|_, _| {
            ["1.2.0", "1.6.0", "2.1.0"]
                .iter()
                .map(|v| v.to_string())
                .collect()
        });
        create(&kube, "warehouses", object, &admin).unwrap();
        let transcript = Transcript::default();
        kargo.tick(&kube, &transcript).await;
        let r = resource(&kube, "freights");
        let charts: Vec<Value> = kube
            .store()
            .list(&r, NS, &Selector::default(), &Selector::default())
            .iter()
            .map(|f| f["charts"][0]["version"].clone())
            .collect();
        (charts, get(&kube, "warehouses", "w"), transcript.text())
    }
    let (charts, warehouse_object, said) = discover("not a constraint").await;
    assert!(charts.is_empty(), "{charts:?}");
    let conditions = &warehouse_object["status"]["conditions"];
    assert_eq!(conditions[0]["type"], json!("Healthy"), "{conditions}");
    assert_eq!(conditions[0]["status"], json!("False"));
    assert_eq!(conditions[0]["reason"], json!("DiscoveryFailed"));
    assert!(
        conditions[0]["message"]
            .as_str()
            .unwrap()
            .contains("improper constraint: not a constraint"),
        "{conditions}"
    );
    assert!(said.contains("Warehouse w: no Freight"), "{said}");

    let (charts, ..) = discover("1.0.0 - 1.5.0 || ^3").await;
    assert_eq!(charts, vec![json!("1.2.0")]);
}
