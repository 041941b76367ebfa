//! Who a direct door serves, checked once per request before the router sees it: a request
//! must name this machine or one of the intercepted hosts in `Host` (or `:authority`), so a
//! web page whose name was re-pointed at 127.0.0.1 (DNS rebinding) reaches nothing; and, when
//! the config asks for one, it must carry the door's credential, which is then taken off.

use std::net::IpAddr;

use http::{Request, Response, StatusCode};

use super::auth::DoorCheck;
use super::state::ProxyState;
use crate::config::host_matches;
use crate::http::Body;

/// Why a direct-door request is not served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    #[error(
        "cursor-byok: this door serves 127.0.0.1, localhost and Cursor's hosts only; a request \
         for `{0}` is refused (a web page's name pointed at this machine)"
    )]
    Host(String),
    #[error("cursor-byok: a request without a Host is refused on this door")]
    NoHost,
    #[error("the door's credential is missing")]
    Credential,
}

/// Admits one direct-door request (`None`), or answers why not.
pub(crate) fn direct_door<B>(state: &ProxyState, req: &mut Request<B>) -> Option<Response<Body>> {
    let host = request_host(req);
    if let Err(refused) = host_allowed(host.as_deref(), &state.intercept) {
        tracing::info!(%refused, "direct door request refused");
        return Some(super::plain_error(
            StatusCode::FORBIDDEN,
            &refused.to_string(),
        ));
    }
    if let Some(check) = &state.door_auth {
        if !check.allows(req.headers()) {
            tracing::info!(refused = %Refused::Credential, "direct door request refused");
            return Some(super::auth::door_required());
        }
        DoorCheck::strip(req.headers_mut());
    }
    None
}

/// The host a request names: HTTP/2's `:authority` (in the URI), else `Host`; without port.
fn request_host<B>(req: &Request<B>) -> Option<String> {
    if let Some(authority) = req.uri().authority() {
        return Some(crate::http::host_of(authority));
    }
    let value = req.headers().get(http::header::HOST)?.to_str().ok()?;
    let authority = value.trim().parse::<http::uri::Authority>().ok()?;
    Some(crate::http::host_of(&authority))
}

fn host_allowed(host: Option<&str>, intercept: &[String]) -> Result<(), Refused> {
    let Some(host) = host.filter(|h| !h.is_empty()) else {
        return Err(Refused::NoHost);
    };
    let local = host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if local || host_matches(intercept, host) {
        Ok(())
    } else {
        Err(Refused::Host(host.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_machine_and_intercepted_names_pass() {
        let p = vec!["*.cursor.sh".to_string()];
        for ok in [
            "127.0.0.1",
            "localhost",
            "::1",
            "api2.cursor.sh",
            "127.3.4.5",
        ] {
            assert_eq!(host_allowed(Some(ok), &p), Ok(()), "{ok}");
        }
        for bad in [
            "evil.example",
            "10.0.0.1",
            "cursor.sh.evil.example",
            "0.0.0.0",
        ] {
            assert!(host_allowed(Some(bad), &p).is_err(), "{bad}");
        }
        assert_eq!(host_allowed(None, &p), Err(Refused::NoHost));
    }

    #[test]
    fn the_host_is_read_from_the_authority_or_the_header() {
        let req = Request::builder()
            .uri("https://API2.cursor.sh:8443/x")
            .body(())
            .expect("request");
        assert_eq!(request_host(&req).as_deref(), Some("api2.cursor.sh"));
        let req = Request::builder()
            .uri("/x")
            .header("host", "evil.example:8080")
            .body(())
            .expect("request");
        assert_eq!(request_host(&req).as_deref(), Some("evil.example"));
        let req = Request::builder()
            .uri("/x")
            .header("host", "[::1]:80")
            .body(())
            .expect("request");
        assert_eq!(request_host(&req).as_deref(), Some("::1"));
        let req = Request::builder().uri("/x").body(()).expect("request");
        assert_eq!(request_host(&req), None);
    }
}
