//! The readable record of a run: what each actor did, in order.

use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
pub struct Transcript {
    lines: Arc<Mutex<Vec<String>>>,
    echo: bool,
}

impl Transcript {
    /// A transcript that also prints each line as it is said.
    pub fn echoing() -> Transcript {
        Transcript {
            lines: Arc::default(),
            echo: true,
        }
    }

    pub fn say(&self, actor: &str, message: impl std::fmt::Display) {
        let line = format!("[{actor}] {message}");
        if self.echo {
            println!("{line}");
        }
        self.lines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(line);
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn text(&self) -> String {
        let mut text = self.lines().join("\n");
        text.push('\n');
        text
    }
}
