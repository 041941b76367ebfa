//! The proxy auto-configuration (PAC) script. The OS's automatic proxy setting points at it
//! (`cursor-byok setup system-proxy`):
//! - the hosts that carry Cursor's agent RPCs ([`AGENT_HOSTS`]) go to the proxy with **no**
//!   fallback: when the proxy does not answer, their requests fail instead of reaching Cursor,
//!   so a chat with one of the user's models selected never sends its prompt to Cursor;
//! - Cursor's other hosts go to the proxy with `DIRECT` as the fallback;
//! - every other host goes `DIRECT`.
//!
//! Which hosts carry agent RPCs (Cursor 3.2x, `../shared/docs/cursor-notes.md` §1, §10,
//! `protocol/agent-ws.md` §1, `inference.md` §3): `api2.cursor.sh` (every Connect RPC by
//! default: `Run`, `RunSSE` + `BidiAppend`, `RunInference` and its HTTP/1.1 companions, the
//! agent WebSocket, and the side calls that carry a conversation), and the agent hosts under
//! `api5.cursor.sh` (`agent.`, `agentn.`, `agentn.global.`). The price: while the proxy is
//! down, Cursor's AI features fail on those hosts for Cursor's own models too.
//!
//! Served by the proxy listener at [`PAC_PATH`] and written to the data directory as
//! [`PAC_FILE`]; the text is a pure function of the listen address and the intercept patterns.
//! A PAC consumer that cannot fetch the script goes DIRECT for every host, so the login
//! service's manager holds the listener's socket (`setup::service`): a fetch made while the
//! proxy is down waits for it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Where the proxy listener serves the script.
pub const PAC_PATH: &str = "/__cursor-byok/proxy.pac";
/// The copy in the data directory.
pub const PAC_FILE: &str = "proxy.pac";
/// The media type PAC fetchers expect.
pub const PAC_CONTENT_TYPE: &str = "application/x-ns-proxy-autoconfig";

/// The address clients dial: a wildcard listen address is reached on loopback.
pub fn reachable(listen: SocketAddr) -> SocketAddr {
    let ip = match listen.ip() {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, listen.port())
}

/// Hosts that carry agent RPCs: exact names, and `.suffix`es (a host ending in one).
pub const AGENT_HOSTS: [&str; 2] = ["api2.cursor.sh", ".api5.cursor.sh"];

/// The `FindProxyForURL` answer for Cursor's other hosts: the proxy first, `DIRECT` when it
/// does not answer (every PAC engine tries the entries in order).
pub(crate) fn proxy_directive(listen: SocketAddr) -> String {
    format!("PROXY {}; DIRECT", reachable(listen))
}

/// The answer for [`AGENT_HOSTS`]: the proxy and nothing else, so a request fails rather
/// than go to Cursor when the proxy is down.
pub(crate) fn agent_directive(listen: SocketAddr) -> String {
    format!("PROXY {}", reachable(listen))
}

/// The script for a proxy on `listen` intercepting `patterns` (`*.domain` or exact hosts, as
/// the config validated them). A `*.domain` pattern also sends `domain` itself: the proxy
/// tunnels what it does not intercept, so Cursor's hosts all take one path.
pub fn script(listen: SocketAddr, patterns: &[String]) -> String {
    let mut suffixes = Vec::new();
    let mut exact = Vec::new();
    for p in patterns {
        let p = p.trim_end_matches('.').to_ascii_lowercase();
        match p.strip_prefix("*.") {
            Some(domain) => {
                suffixes.push(format!(".{domain}"));
                exact.push(domain.to_string());
            }
            None => exact.push(p),
        }
    }
    exact.dedup();
    // JSON string literals are valid JavaScript string literals: no pattern can break out.
    let list = |v: &[String]| serde_json::to_string(v).unwrap_or_else(|_| "[]".into());
    let directive = serde_json::to_string(&proxy_directive(listen)).unwrap_or_default();
    let agent = serde_json::to_string(&agent_directive(listen)).unwrap_or_default();
    let agent_hosts: Vec<String> = AGENT_HOSTS.iter().map(|h| h.to_string()).collect();
    format!(
        r#"// cursor-byok: the hosts that carry Cursor's agent go through the proxy on {addr} with no
// fallback (while the proxy is down they fail, so no chat on your own model reaches Cursor);
// Cursor's other hosts go through it, DIRECT when it does not answer; every other host goes
// DIRECT. Generated; `cursor-byok setup system-proxy --undo` removes the OS setting that
// points here.
var cursorByokSuffixes = {suffixes};
var cursorByokHosts = {exact};
var cursorByokAgentHosts = {agent_hosts};
function cursorByokMatches(h, list) {{
  var i;
  for (i = 0; i < list.length; i++) {{
    var s = list[i];
    if (h == s) {{
      return true;
    }}
    if (s.charAt(0) == "." && h.length > s.length && h.substring(h.length - s.length) == s) {{
      return true;
    }}
  }}
  return false;
}}
function FindProxyForURL(url, host) {{
  var h = String(host).toLowerCase();
  if (h.charAt(h.length - 1) == ".") {{
    h = h.substring(0, h.length - 1);
  }}
  if (!cursorByokMatches(h, cursorByokHosts) && !cursorByokMatches(h, cursorByokSuffixes)) {{
    return "DIRECT";
  }}
  if (cursorByokMatches(h, cursorByokAgentHosts)) {{
    return {agent};
  }}
  return {directive};
}}
"#,
        addr = reachable(listen),
        suffixes = list(&suffixes),
        exact = list(&exact),
        agent_hosts = list(&agent_hosts),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_listen_is_reached_on_loopback() {
        let any: SocketAddr = "0.0.0.0:8787".parse().unwrap();
        assert_eq!(proxy_directive(any), "PROXY 127.0.0.1:8787; DIRECT");
        assert_eq!(agent_directive(any), "PROXY 127.0.0.1:8787");
        let s = script(any, &["*.cursor.sh".into()]);
        assert!(
            s.contains(r#"var cursorByokSuffixes = [".cursor.sh"];"#),
            "{s}"
        );
        assert!(s.contains(r#"var cursorByokHosts = ["cursor.sh"];"#), "{s}");
    }

    #[test]
    fn a_pattern_cannot_break_out_of_its_string() {
        let s = script("127.0.0.1:1".parse().unwrap(), &["a\";alert(1);//".into()]);
        assert!(s.contains(r#"["a\";alert(1);//"]"#), "{s}");
    }
}
