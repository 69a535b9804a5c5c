//! The API double applies a custom resource's structural schema on every write, through the
//! product's own implementation (`gitops_loop::schema`): prune, default, validate.

use serde_json::Value;

use super::store::ApiError;

/// Prunes unknown fields and validates `object` against `schema`; the error lists every
/// violation with its field path, as the API server's 422 does.
pub fn prune_and_validate(object: &mut Value, schema: &Value, kind: &str) -> Result<(), ApiError> {
    let mut errors = gitops_loop::schema::prune_and_validate(object, schema).errors;
    if errors.is_empty() {
        return Ok(());
    }
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let message = if errors.len() == 1 {
        errors.remove(0)
    } else {
        format!("[{}]", errors.join(", "))
    };
    Err(ApiError::new(
        422,
        "Invalid",
        format!("{kind} \"{name}\" is invalid: {message}"),
    ))
}
