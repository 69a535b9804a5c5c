//! Version constraints as Kargo v1.11.2 reads them: its Warehouses (chart `semverConstraint`,
//! image `constraint`) and its Warehouse webhook parse them with Masterminds/semver v3.4.0
//! (`NewConstraint`, `NewVersion`). That grammar is not Cargo's: `||` joins alternatives,
//! `a - b` is an inclusive range, comparators are separated by spaces or commas, `x`, `X` and
//! `*` are wildcards, and a prerelease matches only when its alternative names a prerelease.
//! The `semver` crate parses none of `||`, hyphen ranges or space-separated comparators, so the
//! ground implements the grammar here (no Rust crate implements Masterminds' dialect; the npm
//! dialect of `node-semver` differs in prerelease and wildcard handling).
//!
//! The lexical grammar (what a constraint and a version may look like) is given as regular
//! expressions, because that is how Masterminds defines it; the `regex` crate and Go's RE2 both
//! prefer the leftmost alternative, so they agree on every match.

use std::cmp::Ordering;
use std::sync::LazyLock;

use regex::Regex;

/// Go's `\s` (RE2): ASCII whitespace without the vertical tab.
const WS: &str = r"[\t\n\f\r ]";
/// A version inside a constraint (wildcards allowed; `|` is in Masterminds' class too).
const CONSTRAINT_VERSION: &str = r"v?([0-9|xX*]+)(\.[0-9|xX*]+)?(\.[0-9|xX*]+)?(-([0-9A-Za-z\-]+(\.[0-9A-Za-z\-]+)*))?(\+([0-9A-Za-z\-]+(\.[0-9A-Za-z\-]+)*))?";
/// The operators, the empty one second (its position decides which alternative wins).
const OPERATORS: &str = r"=||!=|>|<|>=|=>|<=|=<|~|~>|\^";

fn compile(pattern: &str) -> Regex {
    Regex::new(pattern).expect("a fixed pattern")
}

static ONE: LazyLock<Regex> = LazyLock::new(|| {
    compile(&format!(
        "^{WS}*({OPERATORS}){WS}*({CONSTRAINT_VERSION}){WS}*$"
    ))
});
static HYPHEN: LazyLock<Regex> = LazyLock::new(|| {
    compile(&format!(
        "{WS}*({CONSTRAINT_VERSION}){WS}+-{WS}+({CONSTRAINT_VERSION}){WS}*"
    ))
});
static EACH: LazyLock<Regex> =
    LazyLock::new(|| compile(&format!("({OPERATORS}){WS}*({CONSTRAINT_VERSION})")));
static WHOLE: LazyLock<Regex> = LazyLock::new(|| {
    compile(&format!(
        "^({WS}*({OPERATORS}){WS}*({CONSTRAINT_VERSION}){WS}*)((?:{WS}+|,{WS}*)({OPERATORS}){WS}*({CONSTRAINT_VERSION}){WS}*)*$"
    ))
});
/// A version as `NewVersion` coerces it: `v` optional, minor and patch optional, leading
/// zeros allowed in the numbers.
static VERSION: LazyLock<Regex> = LazyLock::new(|| {
    compile(
        r"^v?([0-9]+)(\.[0-9]+)?(\.[0-9]+)?(-([0-9A-Za-z\-]+(\.[0-9A-Za-z\-]+)*))?(\+([0-9A-Za-z\-]+(\.[0-9A-Za-z\-]+)*))?$",
    )
});

/// A version as Masterminds' `NewVersion` reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
    pub pre: String,
    /// As written (ties between equal versions are broken on it).
    pub original: String,
}

impl Version {
    pub fn parse(text: &str) -> Option<Version> {
        let m = VERSION.captures(text)?;
        let number = |i: usize| -> Option<u64> {
            match m.get(i) {
                None => Some(0),
                Some(part) => part.as_str().trim_start_matches('.').parse().ok(),
            }
        };
        let pre = m.get(5).map_or("", |p| p.as_str()).to_string();
        // A numeric prerelease identifier must not start with 0 (the pattern checks the rest).
        if pre
            .split('.')
            .any(|p| p.len() > 1 && p.starts_with('0') && p.bytes().all(|b| b.is_ascii_digit()))
        {
            return None;
        }
        Some(Version {
            major: number(1)?,
            minor: number(2)?,
            patch: number(3)?,
            pre,
            original: text.to_string(),
        })
    }

    /// Precedence: the numbers, then a release above its prereleases, then the prerelease
    /// identifiers left to right (numbers below words, a shorter list below a longer one).
    pub fn precedence(&self, other: &Version) -> Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(other.major, other.minor, other.patch))
            .then_with(|| match (self.pre.is_empty(), other.pre.is_empty()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => prerelease_order(&self.pre, &other.pre),
            })
    }
}

fn prerelease_order(a: &str, b: &str) -> Ordering {
    let (left, right): (Vec<&str>, Vec<&str>) = (a.split('.').collect(), b.split('.').collect());
    for i in 0..left.len().max(right.len()) {
        let (x, y) = (
            left.get(i).copied().unwrap_or(""),
            right.get(i).copied().unwrap_or(""),
        );
        if x == y {
            continue;
        }
        let order = match (x.is_empty(), y.is_empty()) {
            (true, _) => Ordering::Less,
            (_, true) => Ordering::Greater,
            _ => match (x.parse::<u64>(), y.parse::<u64>()) {
                (Ok(p), Ok(q)) if p > q => Ordering::Greater,
                (Ok(_), Ok(_)) => Ordering::Less,
                (Ok(_), Err(_)) => Ordering::Less,
                (Err(_), Ok(_)) => Ordering::Greater,
                (Err(_), Err(_)) => x.cmp(y),
            },
        };
        return order;
    }
    Ordering::Equal
}

/// Which parts of a constraint's version were wildcards or left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loose {
    /// `1.2.3`
    Exact,
    /// `1.2`, `1.2.x`
    Patch,
    /// `1`, `1.x`
    Minor,
    /// `*`, `x`
    Major,
}

#[derive(Debug, Clone)]
struct Comparator {
    operator: String,
    version: Version,
    loose: Loose,
}

/// A parsed constraint: alternatives (`||`), each a list of comparators that must all hold.
#[derive(Debug, Clone)]
pub struct Constraint {
    alternatives: Vec<(Vec<Comparator>, bool)>,
}

impl Constraint {
    /// Parses as `NewConstraint` does; the error names the part that is not a constraint.
    pub fn parse(text: &str) -> Result<Constraint, String> {
        // A hyphen range becomes the two comparators it stands for.
        let text = HYPHEN.replace_all(text, ">= $1, <= $11 ");
        let mut alternatives = Vec::new();
        for segment in text.split("||") {
            if !WHOLE.is_match(segment) {
                return Err(format!("improper constraint: {segment}"));
            }
            let mut comparators = Vec::new();
            for found in EACH.find_iter(segment) {
                comparators.push(comparator(found.as_str())?);
            }
            let names_prerelease = comparators.iter().any(|c| !c.version.pre.is_empty());
            alternatives.push((comparators, names_prerelease));
        }
        Ok(Constraint { alternatives })
    }

    pub fn matches(&self, version: &Version) -> bool {
        self.alternatives.iter().any(|(comparators, prerelease)| {
            (version.pre.is_empty() || *prerelease) && comparators.iter().all(|c| c.admits(version))
        })
    }
}

fn comparator(text: &str) -> Result<Comparator, String> {
    let m = ONE
        .captures(text)
        .ok_or_else(|| format!("improper constraint: {text}"))?;
    let part = |i: usize| m.get(i).map_or("", |p| p.as_str());
    let wild = |p: &str| matches!(p.trim_start_matches('.'), "x" | "X" | "*");
    let (major, minor, patch, pre) = (part(3), part(4), part(5), part(6));
    let (written, loose) = if wild(major) {
        (format!("0.0.0{pre}"), Loose::Major)
    } else if minor.is_empty() || wild(minor) {
        (format!("{major}.0.0{pre}"), Loose::Minor)
    } else if patch.is_empty() || wild(patch) {
        (format!("{major}{minor}.0{pre}"), Loose::Patch)
    } else {
        (part(2).to_string(), Loose::Exact)
    };
    let version = Version::parse(&written).ok_or_else(|| "constraint parser error".to_string())?;
    Ok(Comparator {
        operator: part(1).to_string(),
        version,
        loose,
    })
}

impl Comparator {
    fn admits(&self, v: &Version) -> bool {
        let c = &self.version;
        let order = v.precedence(c);
        match self.operator.as_str() {
            "" | "=" if self.loose == Loose::Exact => order == Ordering::Equal,
            "" | "=" | "~" | "~>" => self.tilde(v),
            "!=" => self.not_equal(v),
            ">" => match self.loose {
                Loose::Exact | Loose::Major => order == Ordering::Greater,
                _ if v.major != c.major => v.major > c.major,
                Loose::Minor => false,
                Loose::Patch => v.minor > c.minor,
            },
            "<" => order == Ordering::Less,
            ">=" | "=>" => order != Ordering::Less,
            "<=" | "=<" => match self.loose {
                Loose::Exact => order != Ordering::Greater,
                _ => {
                    v.major <= c.major
                        && !(v.major == c.major && v.minor > c.minor && self.loose != Loose::Minor)
                }
            },
            "^" => self.caret(v),
            _ => false,
        }
    }

    /// `~1.2.3` is `>=1.2.3 <1.3.0`; `~1` is `>=1.0.0 <2.0.0`; `~*` and `~0.0.0` are anything.
    fn tilde(&self, v: &Version) -> bool {
        let c = &self.version;
        if v.precedence(c) == Ordering::Less {
            return false;
        }
        if (c.major, c.minor, c.patch) == (0, 0, 0)
            && matches!(self.loose, Loose::Exact | Loose::Major)
        {
            return true;
        }
        v.major == c.major && (v.minor == c.minor || self.loose == Loose::Minor)
    }

    /// `^1.2.3` is `>=1.2.3 <2.0.0`; `^0.2.3` is `>=0.2.3 <0.3.0`; `^0.0.3` is `=0.0.3`.
    fn caret(&self, v: &Version) -> bool {
        let c = &self.version;
        if v.precedence(c) == Ordering::Less {
            return false;
        }
        if c.major > 0 || self.loose == Loose::Minor {
            return v.major == c.major;
        }
        if v.major > 0 {
            return false;
        }
        if c.minor > 0 || self.loose == Loose::Patch {
            return v.minor == c.minor;
        }
        if v.minor > 0 {
            return false;
        }
        v.patch == c.patch
    }

    fn not_equal(&self, v: &Version) -> bool {
        let c = &self.version;
        match self.loose {
            Loose::Exact | Loose::Major => {
                if self.loose == Loose::Major
                    && (v.major != c.major || v.minor != c.minor || v.patch != c.patch)
                {
                    return true;
                }
                v.precedence(c) != Ordering::Equal
            }
            Loose::Minor => v.major != c.major,
            Loose::Patch => {
                v.major != c.major
                    || v.minor != c.minor
                    || ((!v.pre.is_empty() || !c.pre.is_empty())
                        && prerelease_order(&v.pre, &c.pre) != Ordering::Equal)
            }
        }
    }
}

/// The newest version satisfying a constraint (every version when it is empty), as Kargo's
/// chart and image selectors pick it: unparseable versions left out, newest by precedence,
/// ties broken on the text as written. A constraint that does not parse is an error.
pub fn newest_version(versions: &[String], constraint: &str) -> Result<Option<String>, String> {
    let constraint = if constraint.is_empty() {
        None
    } else {
        Some(
            Constraint::parse(constraint)
                .map_err(|e| format!("error parsing constraint {constraint:?}: {e}"))?,
        )
    };
    Ok(versions
        .iter()
        .filter_map(|v| Version::parse(v))
        .filter(|v| constraint.as_ref().is_none_or(|c| c.matches(v)))
        .max_by(|a, b| a.precedence(b).then_with(|| a.original.cmp(&b.original)))
        .map(|v| v.original))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Answers of Masterminds/semver v3.4.0 (`NewConstraint`, `NewVersion`, `Check`), recorded
    /// by a throwaway Go program against the module Kargo v1.11.2 pins: constraint, version,
    /// then `bad-constraint`, `bad-version`, `true` or `false`.
    const CASES: &str = include_str!("constraint_cases.tsv");

    #[test]
    fn constraints_are_read_and_checked_as_masterminds_semver_does() {
        let mut wrong = Vec::new();
        for line in CASES.lines() {
            let fields: Vec<&str> = line.split('\t').collect();
            let [constraint, version, wanted] = fields[..] else {
                panic!("a case is constraint, version, answer: {line:?}");
            };
            let got = match Constraint::parse(constraint) {
                Err(_) => "bad-constraint".to_string(),
                Ok(c) => match Version::parse(version) {
                    None => "bad-version".to_string(),
                    Some(v) => c.matches(&v).to_string(),
                },
            };
            if got != wanted {
                wrong.push(format!(
                    "{constraint:?} {version:?}: {got}, Masterminds {wanted}"
                ));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    fn version() -> impl Strategy<Value = String> {
        (
            0u64..4,
            0u64..4,
            0u64..4,
            prop::option::of(prop::sample::select(vec!["alpha", "beta.2", "rc.1", "0"])),
        )
            .prop_map(|(a, b, c, pre)| match pre {
                Some(p) => format!("{a}.{b}.{c}-{p}"),
                None => format!("{a}.{b}.{c}"),
            })
    }

    fn comparator() -> impl Strategy<Value = String> {
        (
            prop::sample::select(vec!["", "=", "!=", ">", "<", ">=", "<=", "~", "^"]),
            version(),
        )
            .prop_map(|(op, v)| format!("{op}{v}"))
    }

    proptest! {
        #[test]
        fn parsing_never_panics(text in "\\PC{0,24}") {
            let _ = Constraint::parse(&text);
            let _ = Version::parse(&text);
        }

        #[test]
        fn an_alternative_matches_when_either_side_does(a in comparator(), b in comparator(), v in version()) {
            let v = Version::parse(&v).expect("a generated version parses");
            let either = Constraint::parse(&format!("{a} || {b}")).expect("parses");
            let left = Constraint::parse(&a).expect("parses");
            let right = Constraint::parse(&b).expect("parses");
            prop_assert_eq!(either.matches(&v), left.matches(&v) || right.matches(&v));
        }

        #[test]
        fn a_hyphen_range_is_the_two_inclusive_bounds(a in version(), b in version(), v in version()) {
            let v = Version::parse(&v).expect("a generated version parses");
            let range = Constraint::parse(&format!("{a} - {b}")).expect("parses");
            let bounds = Constraint::parse(&format!(">= {a}, <= {b}")).expect("parses");
            prop_assert_eq!(range.matches(&v), bounds.matches(&v));
        }

        #[test]
        fn commas_and_spaces_both_join_comparators(a in comparator(), b in comparator(), v in version()) {
            let v = Version::parse(&v).expect("a generated version parses");
            let spaced = Constraint::parse(&format!("{a} {b}")).expect("parses");
            let comma = Constraint::parse(&format!("{a}, {b}")).expect("parses");
            prop_assert_eq!(spaced.matches(&v), comma.matches(&v));
        }

        #[test]
        fn precedence_is_a_total_order(a in version(), b in version(), c in version()) {
            let (a, b, c) = (
                Version::parse(&a).expect("parses"),
                Version::parse(&b).expect("parses"),
                Version::parse(&c).expect("parses"),
            );
            prop_assert_eq!(a.precedence(&b), b.precedence(&a).reverse());
            if a.precedence(&b) != Ordering::Greater && b.precedence(&c) != Ordering::Greater {
                prop_assert_ne!(a.precedence(&c), Ordering::Greater);
            }
        }
    }
}
