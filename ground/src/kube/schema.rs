//! The API double applies a custom resource's structural schema on every write, through the
//! product's own implementation (`gitops_loop::schema`): prune, default, validate.

use serde_json::{Value, json};

use super::store::{ApiError, Resource};

/// How the server treats fields the schema does not know (`?fieldValidation=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    /// Pruned silently.
    Ignore,
    /// Pruned, with one `Warning` header per field (the API server's default).
    #[default]
    Warn,
    /// Refused: 400 BadRequest `strict decoding error`.
    Strict,
}

impl FieldValidation {
    /// The query parameter's value; an unknown one is a 400, as the API server answers.
    pub fn parse(text: Option<&str>) -> Result<FieldValidation, ApiError> {
        match text.unwrap_or("") {
            "" | "Warn" => Ok(FieldValidation::Warn),
            "Ignore" => Ok(FieldValidation::Ignore),
            "Strict" => Ok(FieldValidation::Strict),
            other => Err(ApiError::new(
                400,
                "BadRequest",
                format!("fieldValidation parameter unsupported: {other}"),
            )),
        }
    }
}

/// Prunes unknown fields and validates `object` against `schema`; the error lists every
/// violation with its field path, as the API server's 422 does (`details.causes` one per
/// violation). Returns the paths of the fields it pruned; with `Strict` pruning any is a 400.
pub fn prune_and_validate(
    object: &mut Value,
    schema: &Value,
    resource: &Resource,
    validation: FieldValidation,
) -> Result<Vec<String>, ApiError> {
    let outcome = gitops_loop::schema::prune_and_validate(object, schema);
    let mut pruned: Vec<String> = outcome.pruned.into_iter().map(|(path, _)| path).collect();
    // The API server lists unknown fields sorted.
    pruned.sort();
    if validation == FieldValidation::Strict && !pruned.is_empty() {
        // The API server refuses while decoding, before it validates anything.
        let fields: Vec<String> = pruned
            .iter()
            .map(|p| format!("unknown field \"{p}\""))
            .collect();
        return Err(ApiError::new(
            400,
            "BadRequest",
            format!(
                "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
                fields.join(", "),
                kind = resource.kind,
                version = resource.version
            ),
        ));
    }
    let errors: Vec<String> = outcome
        .errors
        .iter()
        .map(|e| type_error_as_served(e))
        .collect();
    if errors.is_empty() {
        return Ok(pruned);
    }
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    Err(invalid(resource, &name, errors))
}

/// A 422 Invalid about one object: the message lists every violation, `details.causes` holds
/// one entry per violation.
pub fn invalid(resource: &Resource, name: &str, mut errors: Vec<String>) -> ApiError {
    let causes: Vec<Value> = errors.iter().map(|e| cause(e)).collect();
    let message = if errors.len() == 1 {
        errors.remove(0)
    } else {
        format!("[{}]", errors.join(", "))
    };
    let kind = if resource.group.is_empty() {
        resource.kind.clone()
    } else {
        format!("{}.{}", resource.kind, resource.group)
    };
    let mut details = ApiError::object_details(resource, name, &resource.kind);
    details["causes"] = json!(causes);
    ApiError::new(
        422,
        "Invalid",
        format!("{kind} \"{name}\" is invalid: {message}"),
    )
    .with_details(details)
}

/// The API server ends a type error with the type it found (`... must be of type string:
/// "integer"`); the product's schema code words it without.
fn type_error_as_served(error: &str) -> String {
    let found = error
        .split_once(": Invalid value: \"")
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(found, _)| found);
    match found {
        Some(found) if error.contains(" in body must be of type ") && !error.ends_with('"') => {
            format!("{error}: \"{found}\"")
        }
        _ => error.to_string(),
    }
}

/// Checks an object's name as the API server does for most kinds: a lowercase RFC 1123
/// subdomain of at most 253 characters.
pub fn check_name(resource: &Resource, name: &str) -> Result<(), ApiError> {
    let label = |l: &str| {
        !l.is_empty()
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let error = if name.len() > 253 {
        format!("metadata.name: Invalid value: \"{name}\": must be no more than 253 characters")
    } else if !name.split('.').all(label) {
        format!(
            "metadata.name: Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        )
    } else {
        return Ok(());
    };
    Err(invalid(resource, name, vec![error]))
}

/// One violation (`field: Invalid value: ...`) as a `details.causes` entry: the field, the
/// reason the API server's field errors carry, and the message after the field.
pub fn cause(error: &str) -> Value {
    let (field, message) = error.split_once(": ").unwrap_or(("", error));
    if message.starts_with("Invalid value") && message.contains(" in body must be of type ") {
        return json!({"reason": "FieldValueTypeInvalid", "message": message, "field": field});
    }
    let reason = [
        ("Required value", "FieldValueRequired"),
        ("Unsupported value", "FieldValueNotSupported"),
        ("Duplicate value", "FieldValueDuplicate"),
        ("Forbidden", "FieldValueForbidden"),
        ("Too long", "FieldValueTooLong"),
        ("Too many", "FieldValueTooMany"),
        ("Not found", "FieldValueNotFound"),
        ("Internal error", "InternalError"),
        ("Invalid value", "FieldValueInvalid"),
    ]
    .iter()
    .find(|(prefix, _)| message.starts_with(prefix))
    .map(|(_, reason)| *reason)
    .unwrap_or("FieldValueInvalid");
    json!({"reason": reason, "message": message, "field": field})
}

/// The API server's (v1.34) violation for a CRD whose `spec.versions` leaves out `version`,
/// entry `index` of its `status.storedVersions`.
pub fn stored_version_missing(index: usize, version: &str) -> String {
    format!(
        "status.storedVersions[{index}]: Invalid value: \"{version}\": missing from spec.versions; {version} was previously a storage version, and must remain in spec.versions until a storage migration ensures no data remains persisted in {version} and removes {version} from status.storedVersions"
    )
}
