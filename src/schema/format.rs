//! String `format`s the API server checks for custom resources (kube-openapi's `strfmt`
//! registry), worded as its 422 words a mismatch. Only the formats this code checks exactly as
//! kube-openapi does are checked (`uuid`, `uuid3`, `uuid4`, `uuid5`, `hostname`, `ipv6`, `date`,
//! `byte`, `bsonobjectid`, `hexcolor`, `password`); the registry's other formats (`date-time`,
//! `duration`, `email`, `uri`, `ipv4`, `cidr`, `mac`, ...) follow Go libraries whose corners
//! this code does not reproduce, so a value reaching one is reported unchecked, never passed
//! or refused on a guess. Formats the registry does not know (`int32`, `int64`, `double`, ...)
//! are annotations and pass, as they do there.

use regex::Regex;
use std::net::Ipv6Addr;
use std::sync::LazyLock;

/// The verdict on one string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Conforms, or the format is an annotation.
    Passes,
    /// kube-openapi would refuse it.
    Violates,
    /// A registry format this code does not check.
    Unchecked,
}

static PATTERNS: LazyLock<Vec<(&'static str, Regex)>> = LazyLock::new(|| {
    [
        ("uuid", r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$"),
        ("uuid3", r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?3[0-9a-f]{3}-?[0-9a-f]{4}-?[0-9a-f]{12}$"),
        ("uuid4", r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?4[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$"),
        ("uuid5", r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?5[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$"),
        // kube-openapi's HostnamePattern, then its length rules (below).
        (
            "hostname",
            r"^([a-zA-Z0-9\p{S}\p{L}]((-?[a-zA-Z0-9\p{S}\p{L}]{0,62})?)|([a-zA-Z0-9\p{S}\p{L}](([a-zA-Z0-9\-\p{S}\p{L}]{0,61}[a-zA-Z0-9\p{S}\p{L}])?)(\.)){1,}([a-zA-Z\p{L}]){2,63})$",
        ),
        // govalidator's IsBase64.
        (
            "byte",
            r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{4})$",
        ),
        ("bsonobjectid", r"^[0-9a-fA-F]{24}$"),
        ("hexcolor", r"^#?([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$"),
    ]
    .into_iter()
    .map(|(name, pattern)| (name, Regex::new(pattern).expect("a fixed pattern")))
    .collect()
});

/// Go's `time.Parse("2006-01-02", s)`: four digits, two, two, and a real calendar day.
fn is_date(text: &str) -> bool {
    let b = text.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return false;
    }
    let number = |r: std::ops::Range<usize>| -> Option<u32> {
        b[r].iter().try_fold(0u32, |n, c| {
            c.is_ascii_digit().then(|| n * 10 + u32::from(c - b'0'))
        })
    };
    let (Some(year), Some(month), Some(day)) = (number(0..4), number(5..7), number(8..10)) else {
        return false;
    };
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&day)
}

/// Checks `text` against `format`.
pub fn check(format: &str, text: &str) -> Check {
    let conforms = match format {
        "password" => true,
        "ipv6" => text.parse::<Ipv6Addr>().is_ok(),
        "date" => is_date(text),
        "hostname" => {
            PATTERNS[4].1.is_match(text)
                && text.len() <= 255
                && text.split('.').all(|label| label.len() <= 63)
        }
        "uri" | "email" | "ipv4" | "cidr" | "mac" | "isbn" | "isbn10" | "isbn13" | "creditcard"
        | "ssn" | "rgbcolor" | "date-time" | "datetime" | "duration" => {
            return Check::Unchecked;
        }
        _ => match PATTERNS.iter().find(|(name, _)| *name == format) {
            Some((_, re)) => re.is_match(text),
            None => return Check::Passes,
        },
    };
    if conforms {
        Check::Passes
    } else {
        Check::Violates
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_checked_as_kube_openapi_checks_them() {
        for (format, good, bad) in [
            ("date", "2024-02-29", "2026-02-30"),
            ("date", "2026-12-01", "12/01/2026"),
            ("byte", "aGVsbG8=", "not base64!"),
            ("byte", "QR==", ""),
            ("uuid", "123e4567-e89b-12d3-a456-426614174000", "123"),
            ("ipv6", "::1", "1:::2"),
            ("hostname", "api.example.com", "-bad-.example"),
            ("hostname", "bücher.de", "10.0.0.1"),
            ("hostname", "localhost", "example.com."),
            ("hexcolor", "#fff", "#ffff"),
        ] {
            assert_eq!(check(format, good), Check::Passes, "{format} {good}");
            assert_eq!(check(format, bad), Check::Violates, "{format} {bad}");
        }
        assert_eq!(check("int32", "anything"), Check::Passes);
        assert_eq!(check("date-time", "2026-12-01T11:21:27Z"), Check::Unchecked);
        assert_eq!(check("ipv4", "010.0.0.1"), Check::Unchecked);
    }
}
