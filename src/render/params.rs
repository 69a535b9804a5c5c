//! Parameter helpers shared by the generators: Go's value formatting, flattening, merging.
//! (RFC 7386 JSON merge patches, for `.argocd-source*.yaml` and `templatePatch`, are
//! `json_patch::merge`.)

use serde_json::{Map, Value};

use super::template::Params;

/// Formats a number the way Go's `fmt.Sprintf("%v", float64)` does: Argo CD decodes every
/// number as float64, so `1000000` becomes `1e+06`.
pub fn go_format_number(n: &serde_json::Number) -> String {
    let Some(f) = n.as_f64() else {
        return n.to_string();
    };
    if f == 0.0 {
        return "0".to_string();
    }
    if !f.is_finite() {
        return if f.is_nan() {
            "NaN".into()
        } else if f > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    // strconv.FormatFloat(f, 'g', -1, 64): shortest digits; %e when the exponent is below -4
    // or at least the precision (6 for shortest, or the digit count when that is smaller and
    // the number is an integer).
    let exp_form = format!("{f:e}");
    let (mantissa, exponent) = exp_form.split_once('e').unwrap_or((&exp_form, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let digits = mantissa_digits(mantissa) as i32;
    let decimal_point = exponent + 1;
    let mut eprec = 6;
    if eprec > digits && digits >= decimal_point {
        eprec = digits;
    }
    if exponent < -4 || exponent >= eprec {
        return go_exponent(mantissa, exponent);
    }
    format!("{f}")
}

fn mantissa_digits(mantissa: &str) -> usize {
    mantissa.chars().filter(char::is_ascii_digit).count()
}

fn go_exponent(mantissa: &str, exponent: i32) -> String {
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.abs())
}

/// `%v` of a decoded JSON value, as Argo CD's fasttemplate path stringifies parameters.
pub fn go_sprint(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => go_format_number(n),
        Value::Bool(b) => b.to_string(),
        Value::Null => "<nil>".to_string(),
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(go_sprint).collect::<Vec<_>>().join(" ")
        ),
        Value::Object(map) => {
            let mut keys: Vec<_> = map.keys().collect();
            keys.sort();
            format!(
                "map[{}]",
                keys.iter()
                    .map(|k| format!("{k}:{}", go_sprint(&map[*k])))
                    .collect::<Vec<_>>()
                    .join(" ")
            )
        }
    }
}

/// Flattens nested maps and lists into dotted keys with `%v` string values
/// (`a.b`, `list.0`), as the fasttemplate path does with file contents.
pub fn flatten_into(prefix: &str, value: &Value, out: &mut Params) {
    let key = |k: &str| {
        if prefix.is_empty() {
            k.to_string()
        } else {
            format!("{prefix}.{k}")
        }
    };
    match value {
        // Empty maps and lists contribute no parameter (as Argo CD's flatten library does).
        Value::Object(map) => {
            for (k, v) in map {
                flatten_into(&key(k), v, out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                flatten_into(&key(&i.to_string()), v, out);
            }
        }
        other => {
            if !prefix.is_empty() {
                out.insert(prefix.to_string(), Value::String(go_sprint(other)));
            }
        }
    }
}

/// Flattens parameters for label-selector filtering (both modes).
pub fn flatten_params(params: &Params) -> std::collections::BTreeMap<String, String> {
    let mut flat = Params::new();
    for (k, v) in params {
        match v {
            Value::Object(_) | Value::Array(_) => flatten_into(k, v, &mut flat),
            other => {
                flat.insert(k.clone(), Value::String(go_sprint(other)));
            }
        }
    }
    flat.into_iter()
        .map(|(k, v)| (k, v.as_str().unwrap_or_default().to_string()))
        .collect()
}

/// Deep-merges `overlay` into `base`. With `overlay_wins` false, values already in `base` stay.
pub fn deep_merge(base: &mut Map<String, Value>, overlay: &Map<String, Value>, overlay_wins: bool) {
    for (k, v) in overlay {
        match (base.get_mut(k), v) {
            (Some(Value::Object(b)), Value::Object(o)) => deep_merge(b, o, overlay_wins),
            (Some(_), _) if !overlay_wins => {}
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
}

/// A generator's own template merged over the ApplicationSet's (`base`), as Argo CD merges
/// them: `mergo.Merge` of the ApplicationSet's template into the generator's, without
/// override. A value the generator's template sets wins; a Go zero value it holds (`false`,
/// `0`, `""`, an empty list or map, null) is filled from the ApplicationSet's; maps merge key
/// by key; a list it sets replaces the ApplicationSet's whole, and so does a `valuesObject`.
pub fn merge_generator_template(base: &mut Map<String, Value>, overlay: &Map<String, Value>) {
    for (k, v) in overlay {
        // `helm.valuesObject` is raw bytes to Argo CD (a `RawExtension`): the generator's,
        // when it has one, is taken whole.
        if k == "valuesObject" && !v.is_null() {
            base.insert(k.clone(), v.clone());
            continue;
        }
        match (base.get_mut(k), v) {
            (Some(Value::Object(b)), Value::Object(o)) => merge_generator_template(b, o),
            (Some(_), v) if is_go_zero(v) => {}
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
}

/// Whether a value decodes to Go's zero value of its field (what `mergo` calls empty).
fn is_go_zero(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => map.is_empty(),
    }
}

/// Argo CD's `SanitizeName`: lower-case, invalid DNS characters to `-`, at most 253, trimmed.
pub fn normalize_name(name: &str) -> String {
    let lowered: String = name
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let truncated: String = lowered.chars().take(253).collect();
    truncated.trim_matches(|c| c == '-' || c == '.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_generator_template_merges_as_mergo_does() {
        let mut base = json!({
            "metadata": {"labels": {"team": "platform", "tier": "bronze"}},
            "spec": {
                "project": "default",
                "syncPolicy": {"automated": {"prune": true}, "syncOptions": ["A=true"]},
                "source": {"helm": {"valuesObject": {"replicas": 3, "x": 1}}},
                "revisionHistoryLimit": 5
            }
        });
        let overlay = json!({
            "metadata": {"labels": {"tier": "gold", "empty": ""}},
            "spec": {
                "project": "",
                "syncPolicy": {"automated": {"prune": false, "selfHeal": true}, "syncOptions": []},
                "source": {"helm": {"valuesObject": {"replicas": 0}}},
                "revisionHistoryLimit": 0
            }
        });
        let (Value::Object(b), Value::Object(o)) = (&mut base, &overlay) else {
            unreachable!()
        };
        merge_generator_template(b, o);
        assert_eq!(
            base,
            json!({
                "metadata": {"labels": {"team": "platform", "tier": "gold", "empty": ""}},
                "spec": {
                    "project": "default",
                    "syncPolicy": {"automated": {"prune": true, "selfHeal": true}, "syncOptions": ["A=true"]},
                    "source": {"helm": {"valuesObject": {"replicas": 0}}},
                    "revisionHistoryLimit": 5
                }
            })
        );
    }

    #[test]
    fn numbers_print_like_go() {
        let cases = [
            (json!(3), "3"),
            (json!(100000), "100000"),
            (json!(1000000), "1e+06"),
            (json!(1234567), "1.234567e+06"),
            (json!(2.5), "2.5"),
            (json!(0.0001), "0.0001"),
            (json!(0.00001), "1e-05"),
            (json!(-42), "-42"),
        ];
        for (value, expected) in cases {
            assert_eq!(go_sprint(&value), expected, "{value}");
        }
    }

    #[test]
    fn flatten_dots_and_indexes() {
        let mut out = Params::new();
        flatten_into("", &json!({"a": {"b": 1, "c": [true, "x"]}}), &mut out);
        assert_eq!(
            json!(out),
            json!({"a.b": "1", "a.c.0": "true", "a.c.1": "x"})
        );
    }

    #[test]
    fn normalize_like_argo_cd() {
        assert_eq!(normalize_name("Prod_EU/Cluster."), "prod-eu-cluster");
    }
}
