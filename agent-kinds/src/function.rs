//! `function`: a JavaScript `handler(input, ctx)` run in an embedded QuickJS engine, sandboxed.
//!
//! ```yaml
//! - id: scorer
//!   kind: function
//!   source: "function handler(input, ctx) { return { text: 'score: ' + input.tail.length }; }"
//!   timeout: 1s        # CPU time for one turn (default 1s)
//!   memoryMb: 16       # the engine's heap (default 16)
//! ```
//!
//! `input` is the participant's assembled context (`tail` and its declared sources); `ctx` is
//! `{conversationId, agentId, turn, attempt}`. What the handler returns is posted: a string,
//! `{text, data?, schema?, tags?, to?, finality?}`, `{messages: [...]}`, or `null` to pass.
//!
//! The engine is QuickJS without its standard library: there is no `std`, `os`, `require`,
//! module loader, `fetch` or timer, so code can reach no file, network, process or environment
//! variable. Each turn runs in a fresh runtime, with a memory limit (at most the sandbox's) and
//! an interrupt that stops the code at its time limit (wall time on a thread of its own, so it
//! bounds CPU time too), on a blocking thread, never on the server's async threads, and only
//! when one of the [`Sandbox`]'s run slots is free. Checking a scenario only compiles the
//! source (in the same sandbox, with a limit of [`COMPILE_LIMIT`]): none of it runs then.
//! A breach, an exception or a value that is not a reply is the turn's error (logged as a
//! trace by the executor), and nothing else in the server is affected. (Out of memory, the engine often cannot make an error
//! object and throws no value; such an exception is reported as out of memory, so a handler that
//! throws `null` itself is reported that way too.)

use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{json, Value};

use super::execute::{parse_reply, Execute, Reply};
use super::sandbox::Sandbox;
use super::settings::{duration_in, settings};
use agent_sdk::{AgentContext, AgentError};

/// One turn's time limit when the participant names none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest time limit a participant may set.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);
/// The time limit of compiling a source when a scenario is checked.
pub const COMPILE_LIMIT: Duration = Duration::from_millis(200);
/// The engine's heap when the participant names none, in MiB.
pub const DEFAULT_MEMORY_MB: usize = 16;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FunctionSpec {
    source: String,
    #[serde(default)]
    timeout: Option<String>,
    #[serde(default)]
    memory_mb: Option<usize>,
}

/// The `function` kind.
#[derive(Debug, Clone)]
pub struct Function {
    source: String,
    timeout: Duration,
    memory_bytes: usize,
    sandbox: Sandbox,
}

/// Why a run of the handler failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FunctionError {
    /// It ran past its time limit and was interrupted.
    #[error("the function ran past its time limit of {0:?} and was stopped")]
    Timeout(Duration),
    /// It needed more memory than its limit.
    #[error("the function ran out of its {0} MiB of memory and was stopped")]
    OutOfMemory(usize),
    /// It threw, or the source does not compile.
    #[error("the function threw: {0}")]
    Exception(String),
    /// The source defines no `handler` function.
    #[error("the source defines no function handler(input, ctx)")]
    NoHandler,
    /// It returned something that cannot be posted.
    #[error("the function returned {0}")]
    BadValue(String),
}

impl Function {
    /// From a participant's settings; the error names the setting.
    pub fn from_spec(spec: &Value, sandbox: &Sandbox) -> Result<Function, String> {
        let spec: FunctionSpec = settings(spec, "source")?;
        let timeout = match &spec.timeout {
            Some(t) => duration_in("timeout", t, Duration::from_millis(1), MAX_TIMEOUT)?,
            None => DEFAULT_TIMEOUT,
        };
        let cap = usize::try_from(sandbox.memory_mb().min(1024)).unwrap_or(1024);
        let mb = spec.memory_mb.unwrap_or(DEFAULT_MEMORY_MB.min(cap));
        if !(1..=cap).contains(&mb) {
            return Err(format!("memoryMb: from 1 to {cap}"));
        }
        if !spec.source.contains("handler") {
            return Err(format!("source: {}", FunctionError::NoHandler));
        }
        let f = Function {
            source: spec.source,
            timeout,
            memory_bytes: mb * 1024 * 1024,
            sandbox: sandbox.clone(),
        };
        // Refuse a source that does not compile before anything runs; none of it runs here.
        let compile = Function {
            timeout: COMPILE_LIMIT,
            ..f.clone()
        };
        match compile.run_blocking(Value::Null, Value::Null, true) {
            Ok(_) => Ok(f),
            Err(e) => Err(format!("source: {e}")),
        }
    }

    /// Runs the handler with `input` and `ctx` on this thread, within the limits. With `check`,
    /// only compiles the source (as a function body, which is not called): nothing runs.
    pub fn run_blocking(
        &self,
        input: Value,
        ctx: Value,
        check: bool,
    ) -> Result<Value, FunctionError> {
        use rquickjs::{Context, Function as JsFunction, Runtime};
        let mb = self.memory_bytes / (1024 * 1024);
        let engine = |e: rquickjs::Error| FunctionError::Exception(format!("engine: {e}"));
        let rt = Runtime::new().map_err(engine)?;
        rt.set_memory_limit(self.memory_bytes);
        rt.set_max_stack_size(512 * 1024);
        let deadline = Instant::now() + self.timeout;
        rt.set_interrupt_handler(Some(Box::new(move || Instant::now() >= deadline)));
        let cx = Context::full(&rt).map_err(engine)?;
        let timed_out = || Instant::now() >= deadline;
        let ran = cx.with(|cx| {
            let caught = |e: rquickjs::Error| -> FunctionError {
                if timed_out() {
                    return FunctionError::Timeout(self.timeout);
                }
                let text = match e {
                    rquickjs::Error::Exception => {
                        let v = cx.catch();
                        let msg = v
                            .as_exception()
                            .map(|x| {
                                let m = x.message().unwrap_or_default();
                                let name: String = x.get("name").unwrap_or_default();
                                if name.is_empty() {
                                    m
                                } else {
                                    format!("{name}: {m}")
                                }
                            })
                            .or_else(|| {
                                cx.json_stringify(v.clone())
                                    .ok()
                                    .flatten()
                                    .and_then(|s| s.to_string().ok())
                            })
                            .unwrap_or_else(|| "an exception".into());
                        msg
                    }
                    other => other.to_string(),
                };
                if text.contains("out of memory") {
                    FunctionError::OutOfMemory(mb)
                } else if text.contains("interrupted") {
                    FunctionError::Timeout(self.timeout)
                } else {
                    FunctionError::Exception(text)
                }
            };
            if check {
                let compile: JsFunction = cx.globals().get("Function").map_err(caught)?;
                let _: rquickjs::Value = compile.call((self.source.as_str(),)).map_err(caught)?;
                return Ok(Value::Null);
            }
            cx.eval::<(), _>(self.source.as_bytes()).map_err(caught)?;
            let handler: JsFunction = cx
                .globals()
                .get("handler")
                .map_err(|_| FunctionError::NoHandler)?;
            let input = cx.json_parse(input.to_string()).map_err(caught)?;
            let ctx_v = cx.json_parse(ctx.to_string()).map_err(caught)?;
            let out: rquickjs::Value = handler.call((input, ctx_v)).map_err(caught)?;
            if out.is_undefined() || out.is_null() {
                return Ok(Value::Null);
            }
            if let Some(s) = out.as_string() {
                let s = s.to_string().map_err(caught)?;
                return Ok(json!({ "text": s }));
            }
            let text = cx
                .json_stringify(out)
                .map_err(caught)?
                .map(|s| s.to_string())
                .transpose()
                .map_err(caught)?
                .ok_or_else(|| FunctionError::BadValue("a value JSON cannot hold".into()))?;
            serde_json::from_str(&text).map_err(|e| FunctionError::BadValue(e.to_string()))
        });
        // Out of memory, QuickJS often cannot even make the error object and the exception has
        // no value (`null`). A handler that throws `null` itself is reported the same way.
        match ran {
            Err(FunctionError::Exception(text)) if text == "null" => {
                Err(FunctionError::OutOfMemory(mb))
            }
            other => other,
        }
    }
}

#[async_trait]
impl Execute for Function {
    fn kind(&self) -> &'static str {
        "function"
    }

    async fn execute(&self, ctx: &AgentContext, context: Value) -> Result<Reply, AgentError> {
        // At most the sandbox's number of functions and processes run at once.
        let slot = tokio::time::timeout_at(ctx.deadline, self.sandbox.run_slot())
            .await
            .map_err(|_| "function: no run slot was free before the turn's deadline")?;
        let me = self.clone();
        let about = json!({
            "conversationId": ctx.conversation_id,
            "agentId": ctx.agent_id,
            "turn": ctx.turn,
            "attempt": ctx.attempt,
        });
        let out = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            me.run_blocking(context, about, false)
        })
        .await
        .map_err(|e| format!("the function's thread failed: {e}"))??;
        if out.is_null() {
            return Ok(Reply::default());
        }
        parse_reply(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(source: &str) -> Function {
        Function::from_spec(
            &json!({"kind": "function", "source": source, "timeout": "300ms", "memoryMb": 8}),
            &crate::sandbox::loopback(),
        )
        .expect("valid")
    }

    #[test]
    fn returns_text_or_a_message() {
        let out = f("function handler(i, c) { return 'n=' + i.n + ' turn ' + c.turn; }")
            .run_blocking(json!({"n": 3}), json!({"turn": 2}), false)
            .unwrap();
        assert_eq!(out, json!({"text": "n=3 turn 2"}));
        let out = f("function handler(i) { return {text: 'x', data: {sum: i.a + i.b}}; }")
            .run_blocking(json!({"a": 1, "b": 2}), json!({}), false)
            .unwrap();
        assert_eq!(out, json!({"text": "x", "data": {"sum": 3}}));
    }

    #[test]
    fn bad_sources_are_refused_at_load() {
        let e = Function::from_spec(
            &json!({"source": "function nope() {}"}),
            &crate::sandbox::loopback(),
        )
        .unwrap_err();
        assert!(
            e.starts_with("source: ") && e.contains("no function handler"),
            "{e}"
        );
        let e = Function::from_spec(
            &json!({"source": "function handler( {"}),
            &crate::sandbox::loopback(),
        )
        .unwrap_err();
        assert!(e.contains("SyntaxError"), "{e}");
        let e = Function::from_spec(
            &json!({"source": "function handler() {}", "timeout": "soon"}),
            &crate::sandbox::loopback(),
        )
        .unwrap_err();
        assert!(e.starts_with("timeout:"), "{e}");
    }

    #[test]
    fn a_loop_that_never_ends_is_stopped_at_its_time_limit() {
        // The error names the limit that stopped it (QuickJS's interrupt handler, on the real
        // clock: the script burns CPU, so no paused clock applies).
        let e = f("function handler() { while (true) {} }")
            .run_blocking(json!({}), json!({}), false)
            .unwrap_err();
        assert_eq!(e, FunctionError::Timeout(Duration::from_millis(300)));
    }

    #[test]
    fn allocation_without_end_is_stopped_at_its_memory_limit() {
        // In 64 KiB steps with 3 s to go: on a loaded machine 300 ms of 1 KiB steps ran out of
        // time before memory (a time limit reached first is reported as the loop's is).
        let hog = Function::from_spec(
            &json!({"kind": "function", "timeout": "3s", "memoryMb": 8,
                    "source": "function handler() { const a = []; for (;;) { a.push('x'.repeat(65536) + a.length); } }"}),
            &crate::sandbox::loopback(),
        )
        .expect("valid");
        let e = hog.run_blocking(json!({}), json!({}), false).unwrap_err();
        assert_eq!(e, FunctionError::OutOfMemory(8));
    }

    #[test]
    fn a_throw_is_reported_with_its_message() {
        let e = f("function handler() { throw new TypeError('bad input'); }")
            .run_blocking(json!({}), json!({}), false)
            .unwrap_err();
        assert_eq!(e, FunctionError::Exception("TypeError: bad input".into()));
    }

    #[test]
    fn files_network_processes_and_the_environment_are_out_of_reach() {
        for (code, what) in [
            ("return std.loadFile('/etc/passwd');", "std is not defined"),
            ("return os.open('/etc/passwd');", "os is not defined"),
            (
                "return require('fs').readFileSync('/etc/passwd');",
                "require is not defined",
            ),
            (
                "return fetch('http://127.0.0.1:1/');",
                "fetch is not defined",
            ),
            ("return process.env.HOME;", "process is not defined"),
        ] {
            let e = f(&format!("function handler() {{ {code} }}"))
                .run_blocking(json!({}), json!({}), false)
                .unwrap_err();
            assert_eq!(
                e,
                FunctionError::Exception(format!("ReferenceError: {what}")),
                "{code}"
            );
        }
        // A dynamic import has no loader to read a module with.
        let e = f("function handler() { import('/etc/passwd'); return 'no'; }").run_blocking(
            json!({}),
            json!({}),
            false,
        );
        assert!(
            !matches!(&e, Ok(v) if v.to_string().contains("root")),
            "{e:?}"
        );
    }
}
