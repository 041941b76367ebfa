//! Defaults, and the configuration embedded in the binary for a run without a config file.

use std::net::SocketAddr;
use std::path::PathBuf;

use super::failover::FailoverOn;

/// Used when no config file is given. Models appear only for providers whose key variable is set.
pub(crate) const EMBEDDED_DEFAULT: &str = r#"
listen = "127.0.0.1:8787"
intercept = ["*.cursor.sh"]

[providers.openai]
kind = "openai-chat"
api_key_env = "OPENAI_API_KEY"

[providers.anthropic]
kind = "anthropic"
api_key_env = "ANTHROPIC_API_KEY"

[providers.gemini]
kind = "gemini"
api_key_env = "GEMINI_API_KEY"

[providers.openrouter]
kind = "openai-chat"
base_url = "https://openrouter.ai/api/v1"
api_key_env = "OPENROUTER_API_KEY"

[providers.deepseek]
kind = "openai-chat"
base_url = "https://api.deepseek.com/v1"
api_key_env = "DEEPSEEK_API_KEY"

[[models]]
id = "gpt-5.1"
display_name = "GPT-5.1 (BYOK)"
provider = "openai"
model = "gpt-5.1"
context_window = 400000
max_output_tokens = 32000
reasoning_effort = "medium"

[[models]]
id = "claude-sonnet-4-5"
display_name = "Claude Sonnet 4.5 (BYOK)"
provider = "anthropic"
model = "claude-sonnet-4-5"
context_window = 200000
max_output_tokens = 32000
thinking_budget = 4000

[[models]]
id = "gemini-2.5-pro"
display_name = "Gemini 2.5 Pro (BYOK)"
provider = "gemini"
model = "gemini-2.5-pro"
context_window = 1048576
max_output_tokens = 65536
thinking_budget = 8000

[[models]]
id = "openrouter-claude-sonnet-4.5"
display_name = "Claude Sonnet 4.5 via OpenRouter (BYOK)"
provider = "openrouter"
model = "anthropic/claude-sonnet-4.5"
context_window = 200000
max_output_tokens = 32000

[[models]]
id = "deepseek-chat"
display_name = "DeepSeek Chat (BYOK)"
provider = "deepseek"
model = "deepseek-chat"
context_window = 128000
max_output_tokens = 8000
supports_images = false
"#;

/// The OS data directory for this app (`~/.local/share/cursor-byok`, `~/Library/Application
/// Support/cursor-byok`, `%APPDATA%\cursor-byok`); `CURSOR_BYOK_DATA_DIR` overrides it.
pub(crate) fn default_data_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CURSOR_BYOK_DATA_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    dirs::data_dir()
        .or_else(dirs::home_dir)
        .unwrap_or_else(|| PathBuf::from("."))
        .join("cursor-byok")
}

pub(super) fn listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8787))
}

pub(super) fn intercept() -> Vec<String> {
    vec!["*.cursor.sh".to_string()]
}

pub(super) fn origin() -> String {
    "https://api2.cursor.sh".to_string()
}

pub(super) fn yes() -> bool {
    true
}

pub(super) fn max_tool_rounds() -> u32 {
    50
}

pub(super) fn max_parallel_subagents() -> u32 {
    4
}

pub(super) fn heartbeat_secs() -> u64 {
    5
}

pub(super) fn kv_timeout_secs() -> u64 {
    30
}

pub(super) fn provider_idle_secs() -> u64 {
    120
}

pub(super) fn provider_retries() -> u32 {
    2
}

pub(super) fn max_frame_bytes() -> usize {
    16 << 20
}

pub(super) fn max_decompressed_bytes() -> usize {
    64 << 20
}

/// Per listener: far above what Cursor opens (a few dozen connections).
pub(super) fn max_connections() -> usize {
    1024
}

pub(super) fn max_tunnels() -> usize {
    512
}

pub(super) fn tunnel_idle_secs() -> u64 {
    600
}

pub(super) fn tunnel_half_close_secs() -> u64 {
    60
}

pub(super) fn head_timeout_secs() -> u64 {
    15
}

pub(super) fn body_timeout_secs() -> u64 {
    30
}

pub(super) fn max_history_bytes() -> usize {
    64 << 20
}

pub(super) fn context_window() -> u32 {
    128_000
}

pub(super) fn max_output_tokens() -> u32 {
    16_000
}

pub(super) fn failover_on() -> Vec<FailoverOn> {
    use FailoverOn::*;
    vec![Connect, RateLimit, Server, Overloaded, Timeout]
}

pub(super) fn first_token_timeout_secs() -> u64 {
    60
}

pub(super) fn cooldown_secs() -> u64 {
    30
}

pub(super) fn max_cooldown_secs() -> u64 {
    15 * 60
}

pub(super) fn shell_block_secs() -> u64 {
    30
}
