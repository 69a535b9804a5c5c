//! Text helpers the rules and the report share.

/// `s` cut to at most `max` characters, with `…` after a cut: chart-chosen text is bounded
/// where a finding or the report quotes it.
pub fn clip(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(max).collect::<String>())
    }
}
