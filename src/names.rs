//! Kubernetes' own rules for the names a chart controls (`k8s.io/apimachinery/pkg/util/validation`
//! and the CRD validation in `apiextensions-apiserver`). A CRD that breaks them is one the API
//! server rejects; the gate never treats its versions as served, and Bosun never writes them.

/// A DNS-1123 subdomain: lowercase alphanumerics, `-` and `.`, starting and ending with an
/// alphanumeric, at most 253 characters (a CRD's group and name).
pub fn is_dns1123_subdomain(value: &str) -> bool {
    value.len() <= 253
        && !value.is_empty()
        && value.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// A DNS-1123 label: lowercase alphanumerics and `-`, starting and ending with an
/// alphanumeric, at most 63 characters (a namespace's name).
pub fn is_dns1123_label(value: &str) -> bool {
    value.len() <= 63 && !value.contains('.') && is_dns1123_subdomain(value)
}

/// A DNS-1035 label: a lowercase letter, then lowercase alphanumerics and `-`, ending with an
/// alphanumeric, at most 63 characters (a CRD's version names).
pub fn is_dns1035_label(value: &str) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_lowercase()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && !value.ends_with('-')
}

/// A kind: an ASCII letter, then ASCII letters and digits, at most 63 characters (the API server
/// requires the lowercased kind to be a DNS-1035 label; a `-` in a kind is legal there but no
/// real kind has one, and the gate refuses it rather than guess).
pub fn is_kind(value: &str) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_alphabetic()
        && bytes.iter().all(u8::is_ascii_alphanumeric)
}

/// An `apiVersion` value built from names that passed the checks above: `group/version`.
pub fn is_api_version(value: &str) -> bool {
    match value.split_once('/') {
        Some((group, version)) => is_dns1123_subdomain(group) && is_dns1035_label(version),
        None => is_dns1035_label(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_kubernetes_accepts() {
        assert!(is_dns1123_subdomain("external-secrets.io"));
        assert!(is_dns1035_label("v1beta1"));
        assert!(is_kind("ClusterSecretStore"));
        assert!(is_api_version("external-secrets.io/v1"));
        assert!(is_api_version("v1"));
    }

    #[test]
    fn names_kubernetes_rejects() {
        for bad in [
            "", "Upper.io", "a..b", "-a.io", "a-.io", "a b", "a/b", "x\ny",
        ] {
            assert!(!is_dns1123_subdomain(bad), "{bad:?}");
        }
        for bad in [
            "",
            "1v",
            "V1",
            "v1-",
            "v1\n---",
            "v1 ",
            "v1\"",
            "v_1",
            &"v".repeat(64),
        ] {
            assert!(!is_dns1035_label(bad), "{bad:?}");
        }
        for bad in ["", "1Kind", "Kind-x", "Kind\n", "Kind:"] {
            assert!(!is_kind(bad), "{bad:?}");
        }
        assert!(!is_api_version("a.io/v1\nkind: X"));
        assert!(!is_api_version("a.io/"));
    }
}
