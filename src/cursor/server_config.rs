//! `GetServerConfig`: upstream's answer with the two settings that decide which transport (and
//! which host) the desktop's Agent uses.
//!
//! - `cursor.force_http1_agent` (default on): `http2_config = FORCE_BIDI_DISABLED`. The
//!   desktop's HTTP/2 agent client ignores `http.proxy`; with HTTP/2 bidi disabled it uses the
//!   HTTP/1.1 transport (RunSSE + BidiAppend), which goes through the proxy. An upstream
//!   `FORCE_ALL_DISABLED` is already stricter and stays.
//! - `cursor.advertise_direct_door` with `direct.tls_listen` set: `agent_url_config` names the
//!   direct TLS door as `https://localhost:<port>` (the door presents a leaf for `localhost`
//!   signed by our CA, which the user trusts). The client then dials us directly, HTTP/2
//!   included, so HTTP/1.1 is not forced in this mode.

use crate::config::Config;
use crate::proto::aiserver::v1 as ai;

/// The agent URL advertised for the direct TLS door, when that mode is on and the door is
/// configured.
pub(crate) fn direct_door_url(config: &Config) -> Option<String> {
    if !config.cursor.advertise_direct_door {
        return None;
    }
    let addr = config.direct.tls_listen?;
    Some(format!("https://localhost:{}", addr.port()))
}

/// Applies the configured adjustments to upstream's server config; every other field is kept.
pub(crate) fn rewrite_server_config(
    mut resp: ai::GetServerConfigResponse,
    config: &Config,
) -> ai::GetServerConfigResponse {
    if let Some(url) = direct_door_url(config) {
        resp.agent_url_config = Some(ai::AgentUrlConfig {
            agent_url: url.clone(),
            agentn_url: url,
        });
        return resp;
    }
    if config.cursor.advertise_direct_door {
        tracing::warn!(
            "cursor.advertise_direct_door is on but direct.tls_listen is not set; \
             not advertising a direct door"
        );
    }
    if config.cursor.force_http1_agent
        && resp.http2_config != ai::Http2Config::ForceAllDisabled as i32
    {
        resp.http2_config = ai::Http2Config::ForceBidiDisabled as i32;
    }
    resp
}

/// The answer when upstream is unreachable: an otherwise empty config carrying only our
/// adjustments, so the desktop's Agent still goes through us rather than around the proxy.
/// (All other settings are left at their defaults; the client fetches the config again later.)
pub(crate) fn local_server_config(config: &Config) -> ai::GetServerConfigResponse {
    rewrite_server_config(ai::GetServerConfigResponse::default(), config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cursor::test_support::test_config;
    use prost::Message;

    fn sample() -> ai::GetServerConfigResponse {
        ai::GetServerConfigResponse {
            config_version: "v42".into(),
            use_nlb_for_nal: true,
            model_picker_nudge: Some("try it".into()),
            ..Default::default()
        }
    }

    #[test]
    fn forces_bidi_off_and_keeps_the_rest() {
        let config = test_config();
        let out = rewrite_server_config(sample(), &config);
        assert_eq!(out.http2_config, ai::Http2Config::ForceBidiDisabled as i32);
        assert_eq!(out.http2_config, 3);
        assert_eq!(
            ai::GetServerConfigResponse {
                http2_config: 0,
                ..out.clone()
            },
            sample()
        );
        assert!(out.agent_url_config.is_none());
        // Round trip through the wire, as the handler does.
        let back = ai::GetServerConfigResponse::decode(&out.encode_to_vec()[..]).expect("decodes");
        assert_eq!(back, out);
    }

    #[test]
    fn leaves_force_all_disabled_alone() {
        let config = test_config();
        let upstream = ai::GetServerConfigResponse {
            http2_config: ai::Http2Config::ForceAllDisabled as i32,
            ..sample()
        };
        let out = rewrite_server_config(upstream.clone(), &config);
        assert_eq!(out.http2_config, 1);
        assert_eq!(out, upstream);
    }

    #[test]
    fn option_off_passes_through() {
        let mut config = test_config();
        config.cursor.force_http1_agent = false;
        let upstream = ai::GetServerConfigResponse {
            http2_config: ai::Http2Config::ForceAllEnabled as i32,
            ..sample()
        };
        assert_eq!(rewrite_server_config(upstream.clone(), &config), upstream);
    }

    #[test]
    fn advertise_mode_names_the_direct_door() {
        let mut config = test_config();
        config.cursor.advertise_direct_door = true;
        config.direct.tls_listen = Some("127.0.0.1:8443".parse().expect("addr"));
        let upstream = ai::GetServerConfigResponse {
            agent_url_config: Some(ai::AgentUrlConfig {
                agent_url: "https://agent.api5.cursor.sh".into(),
                agentn_url: "https://agentn.api5.cursor.sh".into(),
            }),
            ..sample()
        };
        let out = rewrite_server_config(upstream, &config);
        let urls = out.agent_url_config.expect("set");
        assert_eq!(urls.agent_url, "https://localhost:8443");
        assert_eq!(urls.agentn_url, "https://localhost:8443");
        assert_eq!(
            out.http2_config, 0,
            "HTTP/2 stays allowed: the client dials us"
        );
        assert_eq!(out.config_version, "v42");

        // Without a TLS door there is nothing to advertise: fall back to forcing HTTP/1.1.
        config.direct.tls_listen = None;
        let out = rewrite_server_config(sample(), &config);
        assert!(out.agent_url_config.is_none());
        assert_eq!(out.http2_config, 3);
    }

    #[test]
    fn local_config_carries_only_the_adjustments() {
        let config = test_config();
        let local = local_server_config(&config);
        assert_eq!(
            local,
            ai::GetServerConfigResponse {
                http2_config: 3,
                ..Default::default()
            }
        );
    }
}
