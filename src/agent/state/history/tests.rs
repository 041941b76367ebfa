use std::collections::HashMap;

use bytes::Bytes;
use prost::Message as _;
use serde_json::json;

use super::*;
use crate::agent::state::{
    build_checkpoint, encode_turn, summary_blob, Blob, StepRecord, TurnRecord,
};
use crate::provider::{ExtraData, ProviderExtra, ProviderKind, UserPart};

const OPTS: HistoryOptions = HistoryOptions {
    max_bytes: 1 << 20,
    images_allowed: true,
};

fn no_fallback(_: &pb::ToolCall) -> Option<(String, Value, String, bool)> {
    None
}

fn anthropic_extra() -> ProviderExtra {
    ProviderExtra {
        kind: ProviderKind::Anthropic,
        origin: "https://api.anthropic.com".into(),
        data: ExtraData::AnthropicThinking {
            thinking: "let me look".into(),
            signature: "sig".into(),
        },
    }
}

fn user(text: &str) -> pb::UserMessage {
    pb::UserMessage {
        text: text.into(),
        message_id: format!("id-{text}"),
        ..Default::default()
    }
}

fn ls_call(call_id: &str) -> StepRecord {
    StepRecord::ToolCall {
        tool_call: pb::ToolCall {
            tool: Some(pb::tool_call::Tool::LsToolCall(Default::default())),
            ..Default::default()
        },
        call_id: call_id.into(),
        name: "ls".into(),
        arguments: json!({"path": "."}),
        result: "a.rs\nb.rs".into(),
        is_error: false,
        extra: None,
    }
}

fn text(t: &str) -> StepRecord {
    StepRecord::Assistant { text: t.into() }
}

fn first_turn() -> TurnRecord {
    TurnRecord {
        user: user("list the files"),
        user_wire: None,
        steps: vec![
            StepRecord::Thinking {
                text: "let me look".into(),
                duration_ms: 100,
                extra: Some(anthropic_extra()),
            },
            ls_call("toolu_1"),
            text("Two files."),
        ],
        request_id: "r1".into(),
    }
}

fn second_turn() -> TurnRecord {
    TurnRecord {
        user: user("thanks"),
        user_wire: None,
        steps: vec![text("You're welcome.")],
        request_id: "r2".into(),
    }
}

/// What the client holds: every blob by id.
#[derive(Default)]
struct FakeClient(HashMap<BlobId, Bytes>);

impl FakeClient {
    fn add(&mut self, blobs: &[Blob]) {
        for b in blobs {
            self.0.insert(b.id, b.data.clone());
        }
    }

    /// Answer the builder until nothing is missing; unknown ids are unavailable.
    fn serve(&self, b: &mut HistoryBuilder) {
        for _ in 0..10 {
            let missing = b.missing();
            if missing.is_empty() {
                return;
            }
            // Out of order on purpose.
            for id in missing.into_iter().rev() {
                match self.0.get(&id) {
                    Some(d) => b.supply(id, d.clone()).unwrap(),
                    None => b.mark_unavailable(id),
                }
            }
        }
        panic!("the builder kept asking");
    }
}

fn state_of(turns: &[&crate::agent::state::EncodedTurn]) -> pb::ConversationStateStructure {
    pb::ConversationStateStructure {
        turns: turns
            .iter()
            .map(|t| Bytes::copy_from_slice(&t.turn_id))
            .collect(),
        ..Default::default()
    }
}

fn user_text(m: &Message) -> &str {
    match m {
        Message::User { parts } => match parts.first() {
            Some(UserPart::Text { text }) => text,
            _ => "",
        },
        _ => panic!("not a user message: {m:?}"),
    }
}

#[test]
fn rebuilds_our_turns_exactly() {
    let t1 = encode_turn(&first_turn());
    let t2 = encode_turn(&second_turn());
    let mut client = FakeClient::default();
    client.add(&t1.blobs);
    client.add(&t2.blobs);
    let mut b = HistoryBuilder::new(&state_of(&[&t1, &t2]), OPTS);
    assert_eq!(b.missing(), vec![t2.turn_id, t1.turn_id], "newest first");
    // One turn blob comes from the cache before the client is asked anything.
    b.supply(t1.turn_id, client.0[&t1.turn_id].clone()).unwrap();
    assert!(!b.missing().contains(&t1.turn_id));
    client.serve(&mut b);
    let h = b.finish(&no_fallback).unwrap();

    let expected = vec![
        Message::user_text("list the files"),
        Message::Assistant {
            parts: vec![
                AssistantPart::Reasoning {
                    text: "let me look".into(),
                    extra: Some(anthropic_extra()),
                },
                AssistantPart::ToolCall {
                    id: "toolu_1".into(),
                    name: "ls".into(),
                    arguments: json!({"path": "."}),
                    extra: None,
                },
            ],
        },
        Message::ToolResult {
            call_id: "toolu_1".into(),
            name: "ls".into(),
            content: "a.rs\nb.rs".into(),
            is_error: false,
        },
        Message::Assistant {
            parts: vec![AssistantPart::Text {
                text: "Two files.".into(),
            }],
        },
        Message::user_text("thanks"),
        Message::Assistant {
            parts: vec![AssistantPart::Text {
                text: "You're welcome.".into(),
            }],
        },
    ];
    assert_eq!(h.messages, expected);
    assert_eq!(h.turns, 2);
    assert_eq!(h.omitted_turns, 0);
    assert_eq!(h.turn_starts, vec![(0, t1.turn_id), (4, t2.turn_id)]);
    assert_eq!(h.turn_through(4), Some(t1.turn_id));
    assert_eq!(h.turn_through(3), None);
    assert_eq!(h.turn_through(6), Some(t2.turn_id));
    assert!(h.approx_tokens > 0);
}

#[test]
fn foreign_turns_use_the_fallback() {
    // A turn as Cursor's server writes it: plain steps, no replay field.
    let step = |m: pb::conversation_step::Message| {
        Blob::from_message(&pb::ConversationStep { message: Some(m) })
    };
    use pb::conversation_step::Message as M;
    let um = Blob::from_message(&user("read it"));
    let think = step(M::ThinkingMessage(pb::ThinkingMessage {
        text: "hmm".into(),
        ..Default::default()
    }));
    let read = pb::ToolCall {
        tool: Some(pb::tool_call::Tool::ReadToolCall(Default::default())),
        ..Default::default()
    };
    let call = step(M::ToolCall(read.clone()));
    let unknown = step(M::ToolCall(pb::ToolCall {
        tool: Some(pb::tool_call::Tool::GlobToolCall(Default::default())),
        ..Default::default()
    }));
    let answer = step(M::AssistantMessage(pb::AssistantMessage {
        text: "It says hi.".into(),
        ..Default::default()
    }));
    let turn = Blob::from_message(&pb::ConversationTurnStructure {
        turn: Some(
            pb::conversation_turn_structure::Turn::AgentConversationTurn(
                pb::AgentConversationTurnStructure {
                    user_message: um.id_bytes(),
                    steps: vec![
                        think.id_bytes(),
                        call.id_bytes(),
                        unknown.id_bytes(),
                        answer.id_bytes(),
                    ],
                    ..Default::default()
                },
            ),
        ),
    });
    let mut client = FakeClient::default();
    client.add(&[um, think, call, unknown, answer, turn.clone()]);
    let state = pb::ConversationStateStructure {
        turns: vec![turn.id_bytes()],
        ..Default::default()
    };
    let mut b = HistoryBuilder::new(&state, OPTS);
    client.serve(&mut b);
    let fallback = |tc: &pb::ToolCall| match &tc.tool {
        Some(pb::tool_call::Tool::ReadToolCall(_)) => Some((
            "read".to_string(),
            json!({"path": "a.txt"}),
            "hi".to_string(),
            false,
        )),
        _ => None,
    };
    let h = b.finish(&fallback).unwrap();
    assert_eq!(
        h.messages,
        vec![
            Message::user_text("read it"),
            Message::Assistant {
                parts: vec![
                    AssistantPart::Reasoning {
                        text: "hmm".into(),
                        extra: None
                    },
                    AssistantPart::ToolCall {
                        id: "hist_0_1".into(),
                        name: "read".into(),
                        arguments: json!({"path": "a.txt"}),
                        extra: None,
                    },
                ],
            },
            Message::ToolResult {
                call_id: "hist_0_1".into(),
                name: "read".into(),
                content: "hi".into(),
                is_error: false,
            },
            Message::Assistant {
                parts: vec![AssistantPart::Text {
                    text: "It says hi.".into()
                }],
            },
        ]
    );
}

#[test]
fn wrong_hashes_are_rejected() {
    let t1 = encode_turn(&first_turn());
    let mut b = HistoryBuilder::new(&state_of(&[&t1]), OPTS);
    let err = b
        .supply(t1.turn_id, Bytes::from_static(b"not the turn"))
        .unwrap_err();
    assert!(matches!(err, StateError::BlobIdMismatch { .. }));
    assert_eq!(b.missing(), vec![t1.turn_id]);
    assert!(matches!(
        b.finish(&no_fallback),
        Err(StateError::Incomplete { missing: 1 })
    ));
}

#[test]
fn unavailable_blobs_are_skipped() {
    let t1 = encode_turn(&first_turn());
    let t2 = encode_turn(&second_turn());
    let t3 = encode_turn(&TurnRecord {
        user: user("again"),
        user_wire: None,
        steps: vec![text("ok")],
        request_id: "r3".into(),
    });
    let mut client = FakeClient::default();
    // Turn 1 lost its ls step, turn 2 its user message, turn 3 is gone entirely.
    client.add(&t1.blobs);
    client.0.remove(&t1.blobs[2].id);
    client.add(&t2.blobs);
    client.0.remove(&t2.blobs[0].id);
    let mut b = HistoryBuilder::new(&state_of(&[&t1, &t2, &t3]), OPTS);
    client.serve(&mut b);
    let h = b.finish(&no_fallback).unwrap();
    assert_eq!(h.turns, 1);
    assert_eq!(h.messages.len(), 2);
    assert_eq!(user_text(&h.messages[0]), "list the files");
    let Message::Assistant { parts } = &h.messages[1] else {
        panic!()
    };
    assert_eq!(parts.len(), 2, "thinking and text, no tool call: {parts:?}");
}

#[test]
fn oldest_turns_are_dropped_over_max_bytes() {
    let big = |n: &str| TurnRecord {
        user: user(n),
        user_wire: None,
        steps: vec![text(&n.repeat(1000))],
        request_id: n.into(),
    };
    let turns: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|n| encode_turn(&big(n)))
        .collect();
    let mut client = FakeClient::default();
    for t in &turns {
        client.add(&t.blobs);
    }
    let state = state_of(&turns.iter().collect::<Vec<_>>());
    let opts = HistoryOptions {
        max_bytes: 2500,
        images_allowed: true,
    };
    let mut b = HistoryBuilder::new(&state, opts);
    client.serve(&mut b);
    let h = b.finish(&no_fallback).unwrap();
    assert_eq!(h.omitted_turns, 1);
    assert_eq!(h.turns, 2);
    assert_eq!(user_text(&h.messages[0]), OMITTED_NOTE);
    assert_eq!(user_text(&h.messages[1]), "b");
    assert_eq!(h.turn_starts[0], (1, turns[1].turn_id));

    // The newest turn alone over the limit: a clear error.
    let opts = HistoryOptions {
        max_bytes: 500,
        images_allowed: true,
    };
    let mut b = HistoryBuilder::new(&state, opts);
    client.serve(&mut b);
    assert!(matches!(
        b.finish(&no_fallback),
        Err(StateError::HistoryTooLarge { .. })
    ));
}

#[test]
fn our_summary_replaces_the_turns_it_covers() {
    let t1 = encode_turn(&first_turn());
    let t2 = encode_turn(&second_turn());
    let summary = summary_blob("They listed files.", &t1.turn_id);
    let mut client = FakeClient::default();
    client.add(&t1.blobs);
    client.add(&t2.blobs);
    client.add(std::slice::from_ref(&summary));
    let mut state = state_of(&[&t1, &t2]);
    state.summary = Some(summary.id_bytes());
    let mut b = HistoryBuilder::new(&state, OPTS);
    assert_eq!(
        b.missing(),
        vec![summary.id],
        "the summary decides what else is needed"
    );
    b.supply(summary.id, summary.data.clone()).unwrap();
    assert_eq!(b.missing(), vec![t2.turn_id]);
    client.serve(&mut b);
    let h = b.finish(&no_fallback).unwrap();
    assert_eq!(
        user_text(&h.messages[0]),
        format!("{}\nThey listed files.", summary::SUMMARY_PREFIX)
    );
    assert_eq!(user_text(&h.messages[1]), "thanks");
    assert_eq!(h.summarized_through, Some(t1.turn_id));
    assert_eq!(h.turn_through(1), Some(t1.turn_id));

    // A summary written by Cursor's server says nothing about coverage: every turn is replayed.
    let cursors = Blob::from_message(&pb::ConversationSummary {
        summary: "theirs".into(),
    });
    client.add(std::slice::from_ref(&cursors));
    state.summary = Some(cursors.id_bytes());
    let mut b = HistoryBuilder::new(&state, OPTS);
    client.serve(&mut b);
    let h = b.finish(&no_fallback).unwrap();
    assert_eq!(h.turns, 2);
    assert_eq!(user_text(&h.messages[0]), "list the files");
}

#[test]
fn todos_come_back_from_the_checkpoint() {
    let t1 = encode_turn(&first_turn());
    let todo = pb::TodoItem {
        id: "1".into(),
        content: "write tests".into(),
        status: pb::TodoStatus::InProgress as i32,
        ..Default::default()
    };
    let cp = build_checkpoint(
        &Default::default(),
        &t1.turn_id,
        std::slice::from_ref(&todo),
        10,
        100,
        None,
    );
    let mut client = FakeClient::default();
    client.add(&t1.blobs);
    client.add(&cp.blobs);
    let mut state = cp.state.clone();
    state.todos.push(Bytes::from_static(&[0xee; 32])); // lost: left out
    let mut b = HistoryBuilder::new(&state, OPTS);
    client.serve(&mut b);
    let h = b.finish(&no_fallback).unwrap();
    assert_eq!(h.todos, vec![todo]);
    assert_eq!(h.turns, 1);
}

#[test]
fn repeated_call_ids_are_made_unique() {
    let t = |u: &str| TurnRecord {
        user: user(u),
        user_wire: None,
        steps: vec![ls_call("functions.ls:0"), text("done")],
        request_id: u.into(),
    };
    let (a, b_) = (encode_turn(&t("one")), encode_turn(&t("two")));
    let mut client = FakeClient::default();
    client.add(&a.blobs);
    client.add(&b_.blobs);
    let mut b = HistoryBuilder::new(&state_of(&[&a, &b_]), OPTS);
    client.serve(&mut b);
    let h = b.finish(&no_fallback).unwrap();
    let ids: Vec<&str> = h
        .messages
        .iter()
        .filter_map(|m| match m {
            Message::ToolResult { call_id, .. } => Some(call_id.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(ids, vec!["functions.ls:0", "functions.ls:0_t1s0"]);
    let Message::Assistant { parts } = &h.messages[5] else {
        panic!()
    };
    assert!(matches!(&parts[0], AssistantPart::ToolCall { id, .. } if id == "functions.ls:0_t1s0"));
}

#[test]
fn shell_turns_become_user_notes() {
    let output = pb::ShellOutput {
        stdout: "a.rs".into(),
        stderr: String::new(),
        exit_code: 0,
    };
    let (blobs, turn_id) = crate::agent::state::encode_shell_turn("ls", &output);
    let turn = blobs.last().cloned().unwrap();
    assert_eq!(turn.id, turn_id);
    let mut client = FakeClient::default();
    client.add(&blobs);
    let state = pb::ConversationStateStructure {
        turns: vec![turn.id_bytes(), Bytes::from_static(b"bad id")],
        ..Default::default()
    };
    let mut b = HistoryBuilder::new(&state, OPTS);
    client.serve(&mut b);
    let h = b.finish(&no_fallback).unwrap();
    assert_eq!(h.turns, 1);
    let t = user_text(&h.messages[0]);
    assert!(
        t.contains("$ ls") && t.contains("a.rs") && t.contains("exit code 0"),
        "{t}"
    );
}

#[test]
fn garbage_blobs_are_skipped() {
    // Right hash, wrong content: a "turn" that is not a turn.
    let junk = Blob::new(Bytes::from_static(&[0xff, 0xff, 0xff]));
    let state = pb::ConversationStateStructure {
        turns: vec![junk.id_bytes()],
        ..Default::default()
    };
    let mut b = HistoryBuilder::new(&state, OPTS);
    b.supply(junk.id, junk.data.clone()).unwrap();
    assert!(b.missing().is_empty());
    let h = b.finish(&no_fallback).unwrap();
    assert!(h.messages.is_empty());
    // Decoding an unknown-field-extended turn blob from the encoder works with prost.
    let t1 = encode_turn(&first_turn());
    assert!(pb::ConversationTurnStructure::decode(t1.blobs.last().unwrap().data.clone()).is_ok());
}

#[test]
fn call_ids_are_synthesised_and_deduplicated() {
    let mut ids = CallIds::default();
    assert_eq!(ids.unique(String::new(), 2, 3), "hist_2_3");
    assert_eq!(ids.unique("c".into(), 0, 0), "c");
    assert_eq!(ids.unique("c".into(), 1, 4), "c_t1s4");
}
