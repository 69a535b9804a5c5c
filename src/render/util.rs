//! The render engine's room for helpers: phase traces, a parallel map, the object sort key.

use std::sync::Mutex;

use serde_json::Value;

/// With `GATE_TRACE` set, a line on stderr per phase: milliseconds since the process began.
pub fn trace(subject: &str, phase: &str) {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let start = *START.get_or_init(std::time::Instant::now);
    if *ON.get_or_init(|| std::env::var_os("GATE_TRACE").is_some()) {
        let short: String = subject.chars().take(12).collect();
        eprintln!(
            "gate trace {:>6} ms {short}: {phase}",
            start.elapsed().as_millis()
        );
    }
}

/// Maps `items` with `f` on up to `jobs` threads, keeping no particular order.
pub fn parallel_map<T: Send, R: Send>(
    items: Vec<T>,
    jobs: usize,
    f: impl Fn(T) -> R + Sync,
) -> Vec<R> {
    if items.len() <= 1 || jobs <= 1 {
        return items.into_iter().map(f).collect();
    }
    let queue = Mutex::new(items.into_iter());
    let results = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| {
                loop {
                    let next = queue.lock().unwrap_or_else(|p| p.into_inner()).next();
                    let Some(item) = next else { break };
                    let result = f(item);
                    results
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(result);
                }
            });
        }
    });
    results.into_inner().unwrap_or_else(|p| p.into_inner())
}

/// Sort key: API group, kind, namespace, name.
pub fn object_sort_key(object: &Value) -> (String, String, String, String) {
    let api_version = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let group = api_version
        .rsplit_once('/')
        .map(|(g, _)| g)
        .unwrap_or("")
        .to_string();
    let text = |p: &str| {
        object
            .pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    (
        group,
        text("/kind"),
        text("/metadata/namespace"),
        text("/metadata/name"),
    )
}
