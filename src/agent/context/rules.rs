//! Rules and skills with Cursor's meaning: always-apply rules and the user's own rules go into
//! the system prompt whole; file-globbed rules once a matching file is in play; agent-requested
//! rules and skills are listed (path and description) for the model to read when they apply;
//! manually attached rules only when the user @-mentions them.

use std::fmt::Write;

use super::glob;
use super::text::{cap, strip_frontmatter, MAX_RULE_CHARS};
use crate::proto::agent::v1 as pb;
use pb::cursor_rule_type::Type;

/// How a rule applies.
#[derive(Debug, Clone, PartialEq)]
pub enum RuleKind<'a> {
    Always,
    Globbed(&'a [String]),
    AgentFetched(&'a str),
    Manual,
}

/// A rule's kind. A rule without a type (older clients) applies always, as before types.
pub fn kind(rule: &pb::CursorRule) -> RuleKind<'_> {
    match rule.r#type.as_ref().and_then(|t| t.r#type.as_ref()) {
        None | Some(Type::Global(_)) => RuleKind::Always,
        Some(Type::FileGlobbed(g)) => RuleKind::Globbed(&g.globs),
        Some(Type::AgentFetched(a)) => RuleKind::AgentFetched(&a.description),
        Some(Type::ManuallyAttached(_)) => RuleKind::Manual,
    }
}

/// A `SKILL.md` that arrives as a rule: it is listed with the skills, not as a rule.
pub(crate) fn is_skill_file(path: &str) -> bool {
    path.rsplit(['/', '\\'])
        .next()
        .is_some_and(|n| n.eq_ignore_ascii_case("SKILL.md"))
}

/// A rule's body as the model sees it: frontmatter removed, capped.
pub fn body(rule: &pb::CursorRule) -> String {
    cap(strip_frontmatter(&rule.content).trim(), MAX_RULE_CHARS)
}

fn has_body(rule: &pb::CursorRule) -> bool {
    !strip_frontmatter(&rule.content).trim().is_empty()
}

/// `<rule path="…">body</rule>` for each rule.
pub(crate) fn write_bodies<'a>(s: &mut String, rules: impl Iterator<Item = &'a pb::CursorRule>) {
    for r in rules.filter(|r| has_body(r)) {
        let _ = writeln!(s, "<rule path=\"{}\">\n{}\n</rule>", r.full_path, body(r));
    }
}

/// The rules section of the system prompt: user rules and always-apply rules whole, then the
/// agent-requested rules as a list.
pub(crate) fn write_static(s: &mut String, ctx: &pb::RequestContext) {
    let file_rules = || ctx.rules.iter().filter(|r| !is_skill_file(&r.full_path));
    let always: Vec<&pb::CursorRule> = ctx
        .non_file_rules
        .iter()
        .chain(file_rules().filter(|r| kind(r) == RuleKind::Always))
        .collect();
    let cloud = ctx
        .cloud_rule
        .as_deref()
        .map(str::trim)
        .filter(|c| !c.is_empty());
    if !always.is_empty() || cloud.is_some() {
        s.push_str("\n<rules>\nFollow these rules from the user and the project:\n");
        write_bodies(s, always.into_iter());
        if let Some(c) = cloud {
            let _ = writeln!(
                s,
                "<rule path=\"(team)\">\n{}\n</rule>",
                cap(c, MAX_RULE_CHARS)
            );
        }
        s.push_str("</rules>\n");
    }
    let fetched: Vec<(&str, &str)> = file_rules()
        .filter_map(|r| match kind(r) {
            RuleKind::AgentFetched(d) => Some((r.full_path.as_str(), d)),
            _ => None,
        })
        .collect();
    if !fetched.is_empty() {
        s.push_str(
            "\n<available_rules>\nRules that apply in some situations. When one's description \
             fits the task, read its file with the read tool and follow it:\n",
        );
        for (path, description) in fetched {
            let _ = writeln!(s, "- {path}: {}", one_line(description));
        }
        s.push_str("</available_rules>\n");
    }
}

/// The file-globbed rules that apply once `paths` (workspace-relative) are in play.
pub(crate) fn globbed_for<'a>(
    ctx: &'a pb::RequestContext,
    paths: &[String],
) -> Vec<&'a pb::CursorRule> {
    GlobbedRules::new(ctx).matching(paths)
}

/// A request context's file-globbed rules with their globs compiled: built once per rule set
/// (a turn) and asked at every model call, as the touched paths grow.
#[derive(Debug, Clone, Default)]
pub(crate) struct GlobbedRules<'a> {
    rules: Vec<(&'a pb::CursorRule, glob::Globs)>,
}

impl<'a> GlobbedRules<'a> {
    pub fn new(ctx: &'a pb::RequestContext) -> Self {
        let rules = ctx
            .rules
            .iter()
            .filter_map(|r| match kind(r) {
                RuleKind::Globbed(globs) => Some((r, glob::Globs::new(globs))),
                _ => None,
            })
            .collect();
        GlobbedRules { rules }
    }

    /// The rules that apply once `paths` (workspace-relative) are in play, in their order.
    pub fn matching(&self, paths: &[String]) -> Vec<&'a pb::CursorRule> {
        self.rules
            .iter()
            .filter(|(_, globs)| paths.iter().any(|p| globs.matches(p)))
            .map(|(r, _)| *r)
            .collect()
    }
}

/// A skill as listed: name, description, where its `SKILL.md` is.
#[derive(Debug, Clone, PartialEq)]
pub struct SkillEntry {
    pub name: String,
    pub description: String,
    pub path: String,
}

/// The skills the model may use on its own: `agent_skills` (without those that only run when
/// the user selects them), then `SKILL.md` files that arrived as rules, each path once.
pub fn skills(ctx: &pb::RequestContext) -> Vec<SkillEntry> {
    let mut out: Vec<SkillEntry> = Vec::new();
    let mut push = |e: SkillEntry| {
        if !out.iter().any(|o| o.path == e.path) {
            out.push(e);
        }
    };
    for s in &ctx.agent_skills {
        if s.disable_model_invocation {
            continue;
        }
        push(skill_entry(s));
    }
    let hidden: Vec<&str> = ctx
        .agent_skills
        .iter()
        .filter(|s| s.disable_model_invocation)
        .map(|s| s.full_path.as_str())
        .collect();
    for r in ctx.rules.iter().filter(|r| is_skill_file(&r.full_path)) {
        if hidden.contains(&r.full_path.as_str()) {
            continue;
        }
        let description = match kind(r) {
            RuleKind::AgentFetched(d) if !d.is_empty() => d.to_string(),
            _ => frontmatter_value(&r.frontmatter, "description")
                .or_else(|| frontmatter_value(&r.content, "description"))
                .unwrap_or_default(),
        };
        push(SkillEntry {
            name: frontmatter_value(&r.frontmatter, "name")
                .or_else(|| frontmatter_value(&r.content, "name"))
                .unwrap_or_else(|| dir_name(&r.full_path)),
            description,
            path: r.full_path.clone(),
        });
    }
    out
}

pub(crate) fn skill_entry(s: &pb::AgentSkill) -> SkillEntry {
    let description = if s.description.trim().is_empty() {
        frontmatter_value(&s.content, "description").unwrap_or_default()
    } else {
        s.description.clone()
    };
    SkillEntry {
        name: frontmatter_value(&s.content, "name").unwrap_or_else(|| dir_name(&s.full_path)),
        description,
        path: s.full_path.clone(),
    }
}

pub(crate) fn write_skills(s: &mut String, skills: &[SkillEntry]) {
    if skills.is_empty() {
        return;
    }
    s.push_str(
        "\n<skills>\nSkills you can use. When one fits the task, read its SKILL.md with the read \
         tool first and follow it:\n",
    );
    for k in skills {
        let _ = writeln!(s, "- {} ({}): {}", k.name, k.path, one_line(&k.description));
    }
    s.push_str("</skills>\n");
}

/// The folder holding a `SKILL.md`, the skill's name when its frontmatter has none.
fn dir_name(path: &str) -> String {
    let mut parts = path.rsplit(['/', '\\']).filter(|p| !p.is_empty());
    let file = parts.next().unwrap_or_default();
    if is_skill_file(file) {
        parts.next().unwrap_or(file).to_string()
    } else {
        file.trim_end_matches(".md").to_string()
    }
}

/// `key: value` from a YAML frontmatter block (or from a text that starts with one).
fn frontmatter_value(text: &str, key: &str) -> Option<String> {
    let t = text.trim_start();
    let block = t.strip_prefix("---").map_or(t, |rest| {
        rest.split_once("\n---").map_or(rest, |(head, _)| head)
    });
    block.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key)
            .then(|| v.trim().trim_matches(['"', '\'']).to_string())
            .filter(|v| !v.is_empty())
    })
}

fn one_line(s: &str) -> String {
    let joined: Vec<&str> = s.split_whitespace().collect();
    cap(&joined.join(" "), 500)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn rule(path: &str, content: &str, t: Option<Type>) -> pb::CursorRule {
        pb::CursorRule {
            full_path: path.into(),
            content: content.into(),
            r#type: t.map(|t| pb::CursorRuleType { r#type: Some(t) }),
            ..Default::default()
        }
    }

    fn ctx() -> pb::RequestContext {
        pb::RequestContext {
            rules: vec![
                rule(
                    "/w/.cursor/rules/always.mdc",
                    "---\nalwaysApply: true\n---\nALWAYS-BODY",
                    Some(Type::Global(Default::default())),
                ),
                rule(
                    "/w/.cursor/rules/py.mdc",
                    "PY-BODY",
                    Some(Type::FileGlobbed(pb::CursorRuleTypeFileGlobs {
                        globs: vec!["*.py".into()],
                    })),
                ),
                rule(
                    "/w/.cursor/rules/db.mdc",
                    "DB-BODY",
                    Some(Type::AgentFetched(pb::CursorRuleTypeAgentFetched {
                        description: "Database migrations".into(),
                    })),
                ),
                rule(
                    "/w/.cursor/rules/manual.mdc",
                    "MANUAL-BODY",
                    Some(Type::ManuallyAttached(Default::default())),
                ),
                rule(
                    "/w/.cursor/skills/deploy/SKILL.md",
                    "---\nname: deploy\ndescription: Ship it\n---\nSKILL-BODY",
                    Some(Type::AgentFetched(pb::CursorRuleTypeAgentFetched {
                        description: "Ship it".into(),
                    })),
                ),
            ],
            non_file_rules: vec![rule("", "USER-RULE", None)],
            ..Default::default()
        }
    }

    #[test]
    fn each_rule_type_has_its_meaning() {
        let c = ctx();
        let mut s = String::new();
        write_static(&mut s, &c);
        assert!(s.contains("ALWAYS-BODY"), "{s}");
        assert!(!s.contains("alwaysApply"), "frontmatter is not shown: {s}");
        assert!(s.contains("USER-RULE"), "user rules always apply: {s}");
        assert!(
            s.contains("/w/.cursor/rules/db.mdc: Database migrations"),
            "{s}"
        );
        for absent in [
            "DB-BODY",
            "PY-BODY",
            "MANUAL-BODY",
            "SKILL-BODY",
            "SKILL.md",
        ] {
            assert!(!s.contains(absent), "{absent} must not be in {s}");
        }
        assert!(globbed_for(&c, &["src/app.rs".into()]).is_empty());
        let hit = globbed_for(&c, &["src/main.py".into()]);
        assert_eq!(hit.len(), 1);
        assert_eq!(body(hit[0]), "PY-BODY");
    }

    #[test]
    fn skills_are_listed_not_inlined() {
        let mut c = ctx();
        c.agent_skills = vec![
            pb::AgentSkill {
                full_path: "/w/.cursor/skills/deploy/SKILL.md".into(),
                content: "---\nname: deploy\n---\nSKILL-BODY".into(),
                description: "Ship it".into(),
                ..Default::default()
            },
            pb::AgentSkill {
                full_path: "/w/.cursor/skills/secret/SKILL.md".into(),
                content: "HIDDEN".into(),
                description: "only when asked".into(),
                disable_model_invocation: true,
                ..Default::default()
            },
        ];
        let list = skills(&c);
        assert_eq!(
            list,
            [SkillEntry {
                name: "deploy".into(),
                description: "Ship it".into(),
                path: "/w/.cursor/skills/deploy/SKILL.md".into(),
            }]
        );
        let mut s = String::new();
        write_skills(&mut s, &list);
        assert!(s.contains("- deploy (/w/.cursor/skills/deploy/SKILL.md): Ship it"));
        assert!(!s.contains("SKILL-BODY") && !s.contains("only when asked"));
    }
}
