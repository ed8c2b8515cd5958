//! A gRPC channel that carries the client's bearer token
//! (`authorization: Bearer <token>`) on every call, whatever service it
//! reaches: the generated clients take any service, so each is built on a
//! [`Conn`] instead of a bare `Channel`.

use std::task::Context;
use std::task::Poll;

use tonic::body::Body;
use tonic::codegen::Service;
use tonic::codegen::http;
use tonic::transport::Channel;

/// A `Channel` plus the token to send, if any.
#[derive(Clone, Debug)]
pub struct Conn {
    channel: Channel,
    authorization: Option<http::HeaderValue>,
}

impl Conn {
    pub(crate) fn new(channel: Channel, authorization: Option<http::HeaderValue>) -> Conn {
        Conn { channel, authorization }
    }
}

/// The header value for `token`, or an error naming what is wrong with it.
pub(crate) fn authorization(token: &str) -> Result<http::HeaderValue, String> {
    let mut value = http::HeaderValue::from_str(&format!("Bearer {}", token.trim()))
        .map_err(|_| "the token has characters a header cannot carry".to_string())?;
    value.set_sensitive(true);
    Ok(value)
}

impl Service<http::Request<Body>> for Conn {
    type Response = <Channel as Service<http::Request<Body>>>::Response;
    type Error = <Channel as Service<http::Request<Body>>>::Error;
    type Future = <Channel as Service<http::Request<Body>>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Service::poll_ready(&mut self.channel, cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        if let Some(value) = &self.authorization {
            request.headers_mut().insert(http::header::AUTHORIZATION, value.clone());
        }
        Service::call(&mut self.channel, request)
    }
}
