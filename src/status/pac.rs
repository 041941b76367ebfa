//! The proxy auto-configuration (PAC) script: Cursor's hosts go to the proxy with `DIRECT` as
//! the fallback, every other host goes `DIRECT`. The OS's automatic proxy setting points at it
//! (`cursor-byok setup system-proxy`), so Cursor keeps its servers when the proxy is not running.
//!
//! Served by the proxy listener at [`PAC_PATH`] and written to the data directory as
//! [`PAC_FILE`]; the text is a pure function of the listen address and the intercept patterns.

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

/// The `FindProxyForURL` answer for Cursor's hosts: the proxy first, `DIRECT` when it does not
/// answer (every PAC engine tries the entries in order).
pub fn proxy_directive(listen: SocketAddr) -> String {
    format!("PROXY {}; DIRECT", reachable(listen))
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
    format!(
        r#"// cursor-byok: Cursor's hosts go through the proxy on {addr}, DIRECT when it does not
// answer; every other host goes DIRECT. Generated; `cursor-byok setup system-proxy --undo`
// removes the OS setting that points here.
var cursorByokSuffixes = {suffixes};
var cursorByokHosts = {exact};
function FindProxyForURL(url, host) {{
  var h = String(host).toLowerCase();
  if (h.charAt(h.length - 1) == ".") {{
    h = h.substring(0, h.length - 1);
  }}
  var i;
  for (i = 0; i < cursorByokHosts.length; i++) {{
    if (h == cursorByokHosts[i]) {{
      return {directive};
    }}
  }}
  for (i = 0; i < cursorByokSuffixes.length; i++) {{
    var s = cursorByokSuffixes[i];
    if (h.length > s.length && h.substring(h.length - s.length) == s) {{
      return {directive};
    }}
  }}
  return "DIRECT";
}}
"#,
        addr = reachable(listen),
        suffixes = list(&suffixes),
        exact = list(&exact),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_listen_is_reached_on_loopback() {
        let any: SocketAddr = "0.0.0.0:8787".parse().unwrap();
        assert_eq!(proxy_directive(any), "PROXY 127.0.0.1:8787; DIRECT");
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
