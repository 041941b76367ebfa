//! `cursor-byok run --capture FILE`: a trace of the agent traffic a user can attach to a bug
//! report. One JSON object per line: message type, field names, numbers and sizes (the shape),
//! what this build does not know, the Cursor client version, and the time since the capture
//! started.
//!
//! Redacted by construction: values never enter a record — no file contents, prompts, keys,
//! tokens, paths or header values — unless `--include-content` was given, which adds each
//! message's decoded text, with the client's model credentials taken out and every secret the
//! scrubber knows (the config's keys, a live run's credentials) masked. Bounded in time
//! (`--capture-minutes`) and size.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::base::secret::Scrubber;
use crate::proto::inspect::{self, Report};

/// The file stops growing here (a long session of big checkpoints would otherwise fill a disk).
const MAX_BYTES: u64 = 64 << 20;
/// Nested messages shown in a shape.
const SHAPE_DEPTH: usize = 4;

/// A capture in progress. Cheap to clone; every clone writes to the same file.
#[derive(Clone)]
pub struct Capture {
    inner: Arc<Mutex<CaptureFile>>,
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capture").finish_non_exhaustive()
    }
}

struct CaptureFile {
    out: Option<BufWriter<File>>,
    started: Instant,
    until: Option<Instant>,
    include_content: bool,
    written: u64,
}

/// Which way a message went.
#[derive(Debug, Clone, Copy)]
pub enum Direction {
    /// From Cursor's client to our run.
    FromClient,
    /// From our run to Cursor's client.
    ToClient,
    /// An answer from Cursor's servers we adjusted (model lists, server config).
    FromUpstream,
}

impl Direction {
    fn as_str(self) -> &'static str {
        match self {
            Direction::FromClient => "client->proxy",
            Direction::ToClient => "proxy->client",
            Direction::FromUpstream => "upstream->proxy",
        }
    }
}

impl Capture {
    /// Start a capture into `path` (created or truncated; readable by the user only), for
    /// `minutes` when given.
    pub fn create(
        path: &Path,
        minutes: Option<u64>,
        include_content: bool,
    ) -> std::io::Result<Capture> {
        let file = private_file(path)?;
        let started = Instant::now();
        let capture = Capture {
            inner: Arc::new(Mutex::new(CaptureFile {
                out: Some(BufWriter::new(file)),
                started,
                until: minutes.map(|m| started + Duration::from_secs(m.saturating_mul(60))),
                include_content,
                written: 0,
            })),
        };
        capture.write(json!({
            "capture": "cursor-byok",
            "version": env!("CARGO_PKG_VERSION"),
            "started_unix_ms": unix_ms(),
            "minutes": minutes,
            "include_content": include_content,
            "note": "shapes list field names, numbers and sizes only; no values",
        }));
        Ok(capture)
    }

    /// Record one message: `message_type` fully qualified (`agent.v1.AgentClientMessage`),
    /// `wire` its bytes, `report` what the schema check found in it (when it ran).
    pub fn message(
        &self,
        direction: Direction,
        source: &str,
        message_type: &str,
        wire: &[u8],
        client_version: Option<&str>,
        report: Option<&Report>,
    ) {
        let include_content = match self.inner.lock() {
            Ok(inner) if inner.out.is_some() => inner.include_content,
            _ => return,
        };
        let mut record = json!({
            "dir": direction.as_str(),
            "source": source,
            "type": message_type,
            "bytes": wire.len(),
            "shape": inspect::schema().shape(message_type, wire, SHAPE_DEPTH),
        });
        if let Some(v) = client_version {
            record["client_version"] = json!(v);
        }
        if let Some(r) = report.filter(|r| !r.unknown.is_empty() || r.error.is_some()) {
            record["unknown"] = Value::Array(
                r.unknown
                    .iter()
                    .map(|u| json!({"kind": u.kind.as_str(), "key": u.key, "at": u.at}))
                    .collect(),
            );
            if let Some(e) = &r.error {
                record["malformed"] = json!(e.to_string());
            }
        }
        if include_content {
            record["content"] = json!(decoded_text(message_type, wire));
        }
        self.write(record);
    }

    /// Record the end of a run's stream: `code` is the Connect error code, `None` for success.
    /// The error text is left out (it may quote a provider's message).
    pub fn end_of_stream(&self, code: Option<&str>) {
        self.write(json!({"dir": Direction::ToClient.as_str(), "end": code.unwrap_or("ok")}));
    }

    fn write(&self, mut record: Value) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let now = Instant::now();
        record["t_ms"] = json!(now.duration_since(inner.started).as_millis() as u64);
        let stop = match inner.until {
            Some(until) if now >= until => Some("the capture time is over"),
            _ if inner.written >= MAX_BYTES => Some("the capture reached its size limit"),
            _ => None,
        };
        let Some(out) = inner.out.as_mut() else {
            return;
        };
        let line = match stop {
            Some(why) => json!({"capture_ended": why}).to_string(),
            None => record.to_string(),
        };
        let ok = writeln!(out, "{line}").and_then(|_| out.flush()).is_ok();
        inner.written += line.len() as u64 + 1;
        if stop.is_some() || !ok {
            if !ok {
                tracing::warn!("capture file write failed; capture stopped");
            }
            inner.out = None;
        }
    }
}

/// The decoded message as text, for `--include-content` only: scrubbed (see the module).
fn decoded_text(message_type: &str, wire: &[u8]) -> String {
    use crate::proto::{agent::v1 as ag, aiserver::v1 as ai};
    use prost::Message as _;
    let text = match message_type {
        "agent.v1.AgentClientMessage" => ag::AgentClientMessage::decode(wire).map(|mut m| {
            let credentials = take_credentials(&mut m);
            let text = format!("{m:?}");
            Scrubber::new(credentials.iter().map(String::as_str))
                .scrub(&text)
                .into_owned()
        }),
        "agent.v1.AgentServerMessage" => {
            ag::AgentServerMessage::decode(wire).map(|m| format!("{m:?}"))
        }
        "aiserver.v1.GetServerConfigResponse" => {
            ai::GetServerConfigResponse::decode(wire).map(|m| format!("{m:?}"))
        }
        _ => return String::new(),
    };
    let text = text.unwrap_or_else(|e| format!("undecodable: {e}"));
    crate::base::secret::scrub(&text).into_owned()
}

/// Takes the model credentials out of a run request; their values, to mask wherever else
/// they appear.
fn take_credentials(m: &mut crate::proto::agent::v1::AgentClientMessage) -> Vec<String> {
    use crate::proto::agent::v1 as ag;
    use ag::model_details::Credentials as D;
    use ag::requested_model::Credentials as R;
    let Some(ag::agent_client_message::Message::RunRequest(r)) = &mut m.message else {
        return Vec::new();
    };
    let bedrock = |b: ag::BedrockCredentials| {
        let mut v = vec![b.access_key, b.secret_key];
        v.extend(b.session_token);
        v
    };
    let mut out = Vec::new();
    match r
        .requested_model
        .as_mut()
        .and_then(|m| m.credentials.take())
    {
        Some(R::ApiKeyCredentials(k)) => out.push(k.api_key),
        Some(R::AzureCredentials(a)) => out.push(a.api_key),
        Some(R::BedrockCredentials(b)) => out.extend(bedrock(b)),
        None => {}
    }
    match r.model_details.as_mut().and_then(|m| m.credentials.take()) {
        Some(D::ApiKeyCredentials(k)) => out.push(k.api_key),
        Some(D::AzureCredentials(a)) => out.push(a.api_key),
        Some(D::BedrockCredentials(b)) => out.extend(bedrock(b)),
        None => {}
    }
    out
}

fn private_file(path: &Path) -> std::io::Result<File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::agent::v1 as pb;
    use prost::Message as _;

    fn heartbeat_with_secret() -> Vec<u8> {
        pb::AgentClientMessage {
            message: Some(pb::agent_client_message::Message::RunRequest(
                pb::AgentRunRequest {
                    custom_system_prompt: Some("SECRET-PROMPT".into()),
                    ..Default::default()
                },
            )),
        }
        .encode_to_vec()
    }

    #[test]
    fn records_shapes_not_values_and_stops_when_time_is_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.jsonl");
        let wire = heartbeat_with_secret();
        let record = |c: &Capture, version| {
            let kind = "agent.v1.AgentClientMessage";
            c.message(
                Direction::FromClient,
                "agent run",
                kind,
                &wire,
                version,
                None,
            );
        };
        record(
            &Capture::create(&path, None, false).unwrap(),
            Some("3.24.1"),
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("SECRET"), "{text}");
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1]["type"], "agent.v1.AgentClientMessage");
        assert_eq!(lines[1]["client_version"], "3.24.1");
        let shape = lines[1]["shape"].to_string();
        assert!(shape.contains("custom_system_prompt"), "{shape}");

        record(&Capture::create(&path, None, true).unwrap(), None);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("SECRET-PROMPT"), "{text}");

        let c = Capture::create(&path, Some(0), false).unwrap();
        record(&c, None);
        record(&c, None);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("capture_ended"), "{text}");
        assert_eq!(text.lines().count(), 1, "{text}");
    }

    /// With content, the client's model credentials and every secret the scrubber knows stay
    /// out of the file, wherever in the message they appear.
    #[test]
    fn content_is_scrubbed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.jsonl");
        crate::base::secret::register(["sk-config-CAPTURED-1"]);
        let wire = pb::AgentClientMessage {
            message: Some(pb::agent_client_message::Message::RunRequest(
                pb::AgentRunRequest {
                    custom_system_prompt: Some(
                        "keys sk-client-CAPTURED-2 and sk-config-CAPTURED-1 in a prompt".into(),
                    ),
                    requested_model: Some(pb::RequestedModel {
                        model_id: "byok-m".into(),
                        credentials: Some(pb::requested_model::Credentials::ApiKeyCredentials(
                            pb::ApiKeyCredentials {
                                api_key: "sk-client-CAPTURED-2".into(),
                                ..Default::default()
                            },
                        )),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            )),
        }
        .encode_to_vec();
        let c = Capture::create(&path, None, true).unwrap();
        let kind = "agent.v1.AgentClientMessage";
        c.message(Direction::FromClient, "agent run", kind, &wire, None, None);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("CAPTURED"), "{text}");
        assert!(
            text.contains("in a prompt") && text.contains("byok-m"),
            "{text}"
        );
    }
}
