//! ApplicationSet expansion's room for the generators that combine others: matrix and merge.

use std::collections::HashMap;

use serde_json::Value;

use crate::render::appset::{Expander, ParamSet};
use crate::render::params::{deep_merge, go_sprint};
use crate::render::template::Params;

/// Argo CD lets matrix and merge nest one level.
const MAX_GENERATOR_NESTING: usize = 2;

impl Expander<'_> {
    fn children<'v>(
        &self,
        body: &'v Value,
        kind: &str,
        nesting: usize,
    ) -> Result<&'v Vec<Value>, String> {
        if nesting >= MAX_GENERATOR_NESTING {
            return Err(format!(
                "{kind} generators nest at most {MAX_GENERATOR_NESTING} levels deep"
            ));
        }
        body.get("generators")
            .and_then(Value::as_array)
            .ok_or(format!("{kind}.generators is required"))
    }

    pub(super) fn matrix(&self, body: &Value, nesting: usize) -> Result<Vec<ParamSet>, String> {
        let children = self.children(body, "matrix", nesting)?;
        if children.len() != 2 {
            return Err(format!(
                "matrix needs exactly 2 child generators, found {}",
                children.len()
            ));
        }
        let first = self
            .generate(&children[0], &Params::new(), nesting + 1)
            .map_err(|e| format!("matrix child 0: {e}"))?;
        let mut out = Vec::new();
        for left in first {
            // The second child may use the first child's parameters.
            let second_spec = self
                .render_value(&children[1], std::slice::from_ref(&left.params))?
                .remove(0);
            let second = self
                .generate(&second_spec, &left.params, nesting + 1)
                .map_err(|e| format!("matrix child 1: {e}"))?;
            for right in second {
                let params = self.combine(&left.params, &right.params)?;
                // Child template overrides are ignored inside a matrix.
                out.push(ParamSet {
                    params,
                    template_override: None,
                });
            }
        }
        Ok(out)
    }

    fn combine(&self, left: &Params, right: &Params) -> Result<Params, String> {
        let mut combined = left.clone();
        if self.mode.is_go() {
            deep_merge(&mut combined, right, false);
            return Ok(combined);
        }
        for (k, v) in right {
            match left.get(k) {
                Some(existing) if existing != v => {
                    return Err(format!(
                        "found duplicate key {k} with different value, a: {} ,b: {}",
                        go_sprint(existing),
                        go_sprint(v)
                    ));
                }
                _ => {
                    combined.insert(k.clone(), v.clone());
                }
            }
        }
        Ok(combined)
    }

    pub(super) fn merge(&self, body: &Value, nesting: usize) -> Result<Vec<ParamSet>, String> {
        let children = self.children(body, "merge", nesting)?;
        let keys: Vec<String> = body
            .get("mergeKeys")
            .and_then(Value::as_array)
            .map(|k| {
                k.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        if keys.is_empty() {
            return Err("merge.mergeKeys is required".to_string());
        }
        if children.len() < 2 {
            return Err("merge needs at least 2 child generators".to_string());
        }
        // Argo CD looks merge keys up among the top-level parameters.
        let key_of = |params: &Params| -> String {
            keys.iter()
                .map(|k| params.get(k).map(go_sprint).unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\u{0}")
        };
        let mut base = self
            .generate(&children[0], &Params::new(), nesting + 1)
            .map_err(|e| format!("merge child 0: {e}"))?;
        let mut base_keys = std::collections::HashSet::new();
        for set in &base {
            let key = key_of(&set.params);
            if !base_keys.insert(key.clone()) {
                return Err(format!(
                    "merge child 0: the parameters from a generator were not unique by the given mergeKeys ({} = {:?} twice)",
                    keys.join(", "),
                    key.replace('\u{0}', ",")
                ));
            }
        }
        for (index, child) in children.iter().enumerate().skip(1) {
            let sets = self
                .generate(child, &Params::new(), nesting + 1)
                .map_err(|e| format!("merge child {index}: {e}"))?;
            let mut by_key: HashMap<String, Params> = HashMap::new();
            for set in sets {
                let key = key_of(&set.params);
                if by_key.insert(key.clone(), set.params).is_some() {
                    return Err(format!(
                        "merge child {index}: two parameter sets share the merge key {:?}",
                        key.replace('\u{0}', ",")
                    ));
                }
            }
            for set in &mut base {
                if let Some(overlay) = by_key.get(&key_of(&set.params)) {
                    if self.mode.is_go() {
                        deep_merge(&mut set.params, overlay, true);
                    } else {
                        set.params.extend(overlay.clone());
                    }
                }
            }
        }
        Ok(base)
    }
}
