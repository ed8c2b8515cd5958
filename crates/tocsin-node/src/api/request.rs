//! The caller of an HTTP request (the JSON API and the console), as the
//! API services see it: the bearer token travels in a task-local for the
//! length of the request, and [`rpc`] puts it on the API call it makes, so
//! the services check the token's scopes exactly as for a gRPC client.
//!
//! The console (`/ui`) also takes the token from its cookie
//! ([`CONSOLE_COOKIE`]): a browser sends no `Authorization` header.

use axum::http::HeaderMap;
use axum::http::HeaderValue;

/// The console's cookie holding the bearer token (set by `/ui/login`).
pub const CONSOLE_COOKIE: &str = "tocsin_token";

tokio::task_local! {
    /// The `Authorization` value of the HTTP request being served.
    pub static AUTHORIZATION: Option<HeaderValue>;
}

/// The request's `Authorization` header, or for a console page its
/// cookie's token as `Bearer <token>`.
pub fn authorization(headers: &HeaderMap, console: bool) -> Option<HeaderValue> {
    if let Some(value) = headers.get(axum::http::header::AUTHORIZATION) {
        return Some(value.clone());
    }
    if !console {
        return None;
    }
    let cookies = headers.get_all(axum::http::header::COOKIE);
    let token = cookies
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(CONSOLE_COOKIE)?.strip_prefix('='))?;
    HeaderValue::from_str(&format!("Bearer {token}")).ok()
}

/// `message` as an API call, with the HTTP caller's bearer token.
pub fn rpc<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Ok(Some(value)) = AUTHORIZATION.try_with(Clone::clone)
        && let Ok(value) = tonic::metadata::AsciiMetadataValue::try_from(value.as_bytes())
    {
        request.metadata_mut().insert("authorization", value);
    }
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_console_reads_its_cookie_and_the_api_does_not() {
        let mut headers = HeaderMap::new();
        headers.insert(axum::http::header::COOKIE, HeaderValue::from_static("a=1; tocsin_token=tcn_x_y; b=2"));
        assert_eq!(authorization(&headers, true).unwrap(), "Bearer tcn_x_y");
        assert!(authorization(&headers, false).is_none());
        headers.insert(axum::http::header::AUTHORIZATION, HeaderValue::from_static("Bearer tcn_h_z"));
        assert_eq!(authorization(&headers, true).unwrap(), "Bearer tcn_h_z", "the header wins");
    }
}
