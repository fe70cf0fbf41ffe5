//! Kubernetes client metrics: every request by verb, resource and answer code, with its
//! latency (`eni_operator_kube_client_requests_total{verb,resource,code}`,
//! `eni_operator_kube_client_request_duration_seconds{verb,resource}`), from a tower layer on
//! the kube [`Client`](kube::Client)'s service stack, as client-go's `rest_client_*` families
//! give Go operators. The verb and resource come from the request line ([`classify`], pure).
//! A watch counts when its answer starts (its latency: until the headers).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Method, Request, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tower::{Layer, Service};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    verb: &'static str,
    resource: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DurationLabels {
    verb: &'static str,
    resource: String,
}

type Durations = Family<DurationLabels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 5 ms to ~20 s.
    Histogram::new(exponential_buckets(0.005, 2.0, 13))
}

/// The request families, and the client-side rate limiter's waits ([`crate::kube_limit`]).
#[derive(Clone, Debug)]
pub struct KubeClientMetrics {
    requests: Family<RequestLabels, Counter>,
    durations: Durations,
    /// Requests that waited for a token of `--k8s-client-qps`/`--k8s-client-burst`, and the
    /// seconds they waited.
    pub rate_limiter_waits: Counter,
    pub rate_limiter_wait_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
}

impl Default for KubeClientMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            durations: Family::new_with_constructor(latency_histogram),
            rate_limiter_waits: Counter::default(),
            rate_limiter_wait_seconds: Counter::default(),
        }
    }
}

impl KubeClientMetrics {
    pub fn register(r: &mut Registry) -> Self {
        let m = Self::default();
        r.register(
            "kube_client_requests",
            "Kubernetes API requests by verb, resource and HTTP answer code (\"error\": no answer)",
            m.requests.clone(),
        );
        r.register(
            "kube_client_request_duration_seconds",
            "Latency of Kubernetes API requests, until the answer's headers",
            m.durations.clone(),
        );
        r.register(
            "kube_client_rate_limiter_waits",
            "Kubernetes API requests that waited for the client-side rate limit (--k8s-client-qps)",
            m.rate_limiter_waits.clone(),
        );
        r.register(
            "kube_client_rate_limiter_wait_seconds",
            "Seconds Kubernetes API requests waited for the client-side rate limit",
            m.rate_limiter_wait_seconds.clone(),
        );
        m
    }

    fn record(&self, verb: &'static str, resource: String, code: String, seconds: f64) {
        self.durations
            .get_or_create(&DurationLabels {
                verb,
                resource: resource.clone(),
            })
            .observe(seconds);
        self.requests
            .get_or_create(&RequestLabels {
                verb,
                resource,
                code,
            })
            .inc();
    }

    /// The count of one series (tests, the benchmark).
    pub fn requests(&self, verb: &'static str, resource: &str, code: &str) -> u64 {
        self.requests
            .get_or_create(&RequestLabels {
                verb,
                resource: resource.into(),
                code: code.into(),
            })
            .get()
    }
}

/// The verb (Kubernetes' audit verbs) and resource (`resource` or `resource/subresource`) of a
/// request to the API server; `("get", "other")` style for non-resource paths (`/version`).
pub fn classify(method: &Method, path: &str, query: Option<&str>) -> (&'static str, String) {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let rest = match segments.first() {
        Some(&"api") if segments.len() >= 2 => &segments[2..],
        Some(&"apis") if segments.len() >= 3 => &segments[3..],
        _ => &[][..],
    };
    // namespaces/<ns>/<resource>... is the namespaced form of <resource>...
    let rest = match rest {
        ["namespaces", _, _, ..] => &rest[2..],
        _ => rest,
    };
    let (resource, named) = match rest {
        [] => ("other".to_string(), false),
        [r] => (r.to_string(), false),
        [r, _] => (r.to_string(), true),
        [r, _, sub, ..] => (format!("{r}/{sub}"), true),
    };
    let watch = query.is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let verb = match *method {
        Method::GET if watch => "watch",
        Method::GET if !named && resource != "other" => "list",
        Method::GET => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "other",
    };
    (verb, resource)
}

/// Builds [`RequestMetrics`] services recording into one [`KubeClientMetrics`].
#[derive(Clone)]
pub struct RequestMetricsLayer(pub KubeClientMetrics);

impl<S> Layer<S> for RequestMetricsLayer {
    type Service = RequestMetrics<S>;

    fn layer(&self, inner: S) -> RequestMetrics<S> {
        RequestMetrics {
            inner,
            metrics: self.0.clone(),
        }
    }
}

#[derive(Clone)]
pub struct RequestMetrics<S> {
    inner: S,
    metrics: KubeClientMetrics,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, RB> Service<Request<B>> for RequestMetrics<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let uri = request.uri();
        let (verb, resource) = classify(request.method(), uri.path(), uri.query());
        let metrics = self.metrics.clone();
        let started = tokio::time::Instant::now();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let result = answer.await;
            let code = match &result {
                Ok(r) => r.status().as_u16().to_string(),
                Err(_) => "error".to_string(),
            };
            metrics.record(verb, resource, code, started.elapsed().as_secs_f64());
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt;

    #[test]
    fn verbs_and_resources_as_the_audit_log_names_them() {
        let c = |m: Method, p: &str, q: Option<&str>| {
            let (v, r) = classify(&m, p, q);
            format!("{v} {r}")
        };
        let cn = "/apis/cilium.io/v2/ciliumnodes";
        assert_eq!(c(Method::GET, cn, None), "list ciliumnodes");
        assert_eq!(
            c(Method::GET, cn, Some("watch=true&resourceVersion=5")),
            "watch ciliumnodes"
        );
        assert_eq!(c(Method::GET, &format!("{cn}/n1"), None), "get ciliumnodes");
        assert_eq!(
            c(
                Method::PATCH,
                &format!("{cn}/n1/status"),
                Some("fieldManager=x")
            ),
            "patch ciliumnodes/status"
        );
        assert_eq!(
            c(Method::POST, "/api/v1/namespaces/kube-system/events", None),
            "create events"
        );
        assert_eq!(
            c(
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/eni-operator",
                None
            ),
            "update leases"
        );
        assert_eq!(c(Method::GET, "/api/v1/nodes", None), "list nodes");
        assert_eq!(c(Method::DELETE, "/api/v1/nodes/n1", None), "delete nodes");
        assert_eq!(
            c(Method::GET, "/api/v1/namespaces/ns1", None),
            "get namespaces"
        );
        assert_eq!(c(Method::GET, "/version", None), "get other");
    }

    #[tokio::test]
    async fn each_answer_is_counted_under_its_code() {
        let metrics = KubeClientMetrics::default();
        let svc = RequestMetricsLayer(metrics.clone()).layer(tower::service_fn(
            |r: Request<()>| async move {
                let code = if r.uri().path().ends_with("/missing") {
                    404
                } else {
                    200
                };
                Ok::<_, std::convert::Infallible>(
                    Response::builder().status(code).body(()).unwrap(),
                )
            },
        ));
        for path in [
            "/api/v1/nodes/a",
            "/api/v1/nodes/missing",
            "/api/v1/nodes/b",
        ] {
            let req = Request::get(path).body(()).unwrap();
            svc.clone().oneshot(req).await.unwrap();
        }
        assert_eq!(metrics.requests("get", "nodes", "200"), 2);
        assert_eq!(metrics.requests("get", "nodes", "404"), 1);
        let mut r = Registry::with_prefix("eni_operator");
        r.register("x", "x", metrics.durations.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        assert!(
            text.contains(r#"eni_operator_x_count{verb="get",resource="nodes"} 3"#),
            "{text}"
        );
    }
}
