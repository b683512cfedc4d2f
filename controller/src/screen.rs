//! A tower layer that answers some gRPC requests itself, from their headers and connection
//! alone, before the service behind it reads a body: the one skeleton of the authentication
//! gate ([`crate::auth::gate`]) and the standby gate ([`crate::api::StandbyGate`]), which differ
//! only in what they refuse.

use std::{
    pin::Pin,
    task::{Context, Poll},
};

use tonic::{Status, body::Body};

/// What a gate refuses.
pub trait Screen {
    /// The refusal for `request`, or `None` to pass it on. Only its headers, URI and extensions
    /// (the connection's info) may be read: the body stays unread.
    fn refusal(&self, request: &http::Request<Body>) -> Option<Status>;
}

/// A service behind a gate `F`.
#[derive(Debug, Clone)]
pub struct Screened<S, F> {
    inner: S,
    screen: F,
}

impl<S, F> Screened<S, F> {
    /// `inner`, behind `screen`.
    pub fn new(inner: S, screen: F) -> Self {
        Self { inner, screen }
    }
}

type BoxFuture<T, E> = Pin<Box<dyn std::future::Future<Output = Result<T, E>> + Send>>;

impl<S, F> tower::Service<http::Request<Body>> for Screened<S, F>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>> + Send,
    S::Future: Send + 'static,
    F: Screen,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if let Some(status) = self.screen.refusal(&request) {
            let refusal = status.into_http();
            return Box::pin(async move { Ok(refusal) });
        }
        Box::pin(self.inner.call(request))
    }
}
