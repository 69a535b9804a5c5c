//! Bosun's registry reads against the ground's OCI registry double: what an image says is
//! cached per manifest digest (a tag that moves is read again), and a registry cannot send
//! Bosun's requests to a host off the allowlist (a foreign token realm, a blob redirect).

#![allow(clippy::unwrap_used)] // tests unwrap what they set up themselves

use gitops_loop::bosun::config::NotesConfig;
use gitops_loop::bosun::notes::Notes;
use ground::oci::{OciImage, OciRegistryDouble};
use serde_json::json;
use std::collections::BTreeMap;

const SOURCE: &str = "org.opencontainers.image.source";

fn image(source: &str) -> OciImage {
    OciImage {
        repository: "quay.io/jetstack/cert-manager-controller".into(),
        tag: "v1.19.4".into(),
        labels: BTreeMap::from([(SOURCE.to_string(), source.to_string())]),
        multi_arch: true,
        status: None,
    }
}

fn notes(registry: &OciRegistryDouble) -> Notes {
    let config: NotesConfig = serde_json::from_value(json!({
        "registries": [{"host": "quay.io", "url": registry.url()}]
    }))
    .unwrap();
    Notes::new(config).unwrap()
}

async fn source(notes: &Notes) -> Result<Option<String>, String> {
    notes
        .source("quay.io/jetstack/cert-manager-controller", "v1.19.4")
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn an_image_is_read_once_per_digest_and_a_moved_tag_is_read_again() {
    let registry = OciRegistryDouble::start(&[image("https://github.com/cert-manager/one")])
        .await
        .unwrap();
    let notes = notes(&registry);
    let one = Some("https://github.com/cert-manager/one".to_string());
    assert_eq!(source(&notes).await, Ok(one.clone()));
    let blobs = |from: usize| {
        registry.requests()[from..]
            .iter()
            .filter(|r| r.starts_with("blobs "))
            .count()
    };
    assert!(blobs(0) > 0, "{:?}", registry.requests());
    // The same digest: the tag is resolved again (it could have moved), nothing more is read.
    let before = registry.requests().len();
    assert_eq!(source(&notes).await, Ok(one));
    let again = registry.requests()[before..].to_vec();
    assert!(
        again.iter().all(|r| !r.starts_with("blobs ")
            && (!r.starts_with("manifests ") || r.ends_with(" v1.19.4"))),
        "{again:?}"
    );
    // The tag is pushed again with other content: a new digest, read again.
    registry.put(&image("https://github.com/cert-manager/two"));
    let before = registry.requests().len();
    assert_eq!(
        source(&notes).await,
        Ok(Some("https://github.com/cert-manager/two".to_string()))
    );
    assert!(blobs(before) > 0, "{:?}", registry.requests());
}

#[tokio::test]
async fn a_registry_cannot_send_bosun_to_a_host_off_the_allowlist() {
    // A token realm on another host: refused before any request reaches it.
    let elsewhere = OciRegistryDouble::start(&[]).await.unwrap();
    let registry = OciRegistryDouble::start(&[image("https://github.com/cert-manager/one")])
        .await
        .unwrap();
    registry.set_realm(&format!(
        "{}/token",
        elsewhere.url().replace("127.0.0.1", "localhost")
    ));
    let error = source(&notes(&registry)).await.unwrap_err();
    assert!(error.contains("token realm"), "{error}");
    assert!(
        elsewhere.requests().is_empty(),
        "{:?}",
        elsewhere.requests()
    );

    // A blob redirect to a host not listed as the registry's CDN: not followed.
    let registry = OciRegistryDouble::start(&[image("https://github.com/cert-manager/one")])
        .await
        .unwrap();
    registry.redirect_blobs_to(&elsewhere.url().replace("127.0.0.1", "localhost"));
    let error = source(&notes(&registry)).await.unwrap_err();
    assert!(!error.is_empty());
    assert!(
        elsewhere.requests().is_empty(),
        "{:?}",
        elsewhere.requests()
    );
}

#[tokio::test]
async fn content_that_does_not_match_its_digest_is_not_read() {
    // What is cached per manifest digest must be bound to it: a registry or CDN that serves
    // another config under a digest is refused, and nothing is cached.
    let registry = OciRegistryDouble::start(&[image("https://github.com/cert-manager/one")])
        .await
        .unwrap();
    registry.swap_blobs();
    let error = source(&notes(&registry)).await.unwrap_err();
    assert!(error.contains("does not match"), "{error}");
}
