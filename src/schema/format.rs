//! String `format`s the API server checks for custom resources (kube-openapi's format
//! registry), worded as its 422 words a mismatch. Formats the registry does not know
//! (`int32`, `int64`, `double`, ...) are annotations and pass, as they do there.

use base64::Engine as _;
use regex::Regex;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::LazyLock;

/// `None` when the format is not one this code knows or the value conforms; otherwise
/// `Some(true)`: a violation, or `Some(false)`: a registry format this code does not check.
pub fn violates(format: &str, text: &str) -> Option<bool> {
    static PATTERNS: LazyLock<Vec<(&'static str, Regex)>> = LazyLock::new(|| {
        [
            ("date", r"^\d{4}-\d{2}-\d{2}$"),
            (
                "date-time",
                r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$",
            ),
            ("datetime", r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"),
            ("uuid", r"^(?i)[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$"),
            ("uuid3", r"^(?i)[0-9a-f]{8}-?[0-9a-f]{4}-?3[0-9a-f]{3}-?[0-9a-f]{4}-?[0-9a-f]{12}$"),
            ("uuid4", r"^(?i)[0-9a-f]{8}-?[0-9a-f]{4}-?4[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$"),
            ("uuid5", r"^(?i)[0-9a-f]{8}-?[0-9a-f]{4}-?5[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$"),
            (
                "hostname",
                r"^([a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)(\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*\.?$",
            ),
            ("mac", r"^(?i)([0-9a-f]{2}[:-]){5}[0-9a-f]{2}$"),
            ("email", r"^[^@\s]+@[^@\s]+$"),
            ("hexcolor", r"^#?([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$"),
            ("rgbcolor", r"^rgb\(\s*\d{1,3}\s*,\s*\d{1,3}\s*,\s*\d{1,3}\s*\)$"),
            ("bsonobjectid", r"^[0-9a-fA-F]{24}$"),
            (
                "duration",
                r"^([-+]?(\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))+$|^0$|^\d+\s*(ns|us|ms|s|m|h|d|w|[a-z]+s?)$",
            ),
            ("uri", r"^([a-zA-Z][a-zA-Z0-9+.-]*:[^\s]*|/[^\s]*)$"),
        ]
        .into_iter()
        .map(|(name, pattern)| (name, Regex::new(pattern).expect("a fixed pattern")))
        .collect()
    });
    let conforms = match format {
        "ipv4" => text.parse::<Ipv4Addr>().is_ok(),
        "ipv6" => text.parse::<Ipv6Addr>().is_ok(),
        "cidr" => text.split_once('/').is_some_and(|(ip, bits)| {
            let max = match ip.parse::<IpAddr>() {
                Ok(IpAddr::V4(_)) => 32,
                Ok(IpAddr::V6(_)) => 128,
                Err(_) => return false,
            };
            bits.parse::<u8>().is_ok_and(|b| b <= max)
        }),
        "byte" => base64::engine::general_purpose::STANDARD
            .decode(text)
            .is_ok(),
        "isbn" | "isbn10" | "isbn13" | "creditcard" | "ssn" => return Some(false),
        _ => match PATTERNS.iter().find(|(name, _)| *name == format) {
            Some((_, re)) => re.is_match(text),
            None => return None,
        },
    };
    (!conforms).then_some(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_formats_are_checked_and_annotations_pass() {
        for (format, good, bad) in [
            ("date-time", "2026-12-01T11:21:27Z", "yesterday"),
            ("date", "2026-12-01", "12/01/2026"),
            ("byte", "aGVsbG8=", "not base64!"),
            ("uuid", "123e4567-e89b-12d3-a456-426614174000", "123"),
            ("ipv4", "10.0.0.1", "10.0.0.256"),
            ("ipv6", "::1", "1:::2"),
            ("cidr", "10.0.0.0/8", "10.0.0.0/33"),
            ("hostname", "api.example.com", "-bad-.example"),
            ("mac", "00:1a:2b:3c:4d:5e", "00:1a"),
            ("duration", "1h30m", "soon-ish!"),
            ("uri", "https://example.com/x", "not a uri"),
        ] {
            assert_eq!(violates(format, good), None, "{format} {good}");
            assert_eq!(violates(format, bad), Some(true), "{format} {bad}");
        }
        assert_eq!(violates("int32", "anything"), None);
        assert_eq!(violates("isbn", "x"), Some(false));
    }
}
