//! A local S3-compatible server (moto's, which scripts/test installs from
//! the Python registry and names in `CORDON_S3_SERVER`), with a bucket.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::serve::free_port;

pub struct S3 {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    pub bucket: String,
}

impl Drop for S3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl S3 {
    /// The server with `bucket` made; None (the test skips) when scripts/test
    /// has not installed it, which under CI fails instead.
    pub fn start(bucket: &str) -> Option<S3> {
        let Ok(server) = std::env::var("CORDON_S3_SERVER") else {
            assert!(
                std::env::var("CI").is_err(),
                "the S3 server is missing: run scripts/test, which installs it"
            );
            eprintln!("skipped: CORDON_S3_SERVER is not set (run scripts/test)");
            return None;
        };
        let port = free_port();
        let child = Command::new(&server)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {server}: {e}"));
        let s3 = S3 {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            bucket: bucket.to_string(),
        };
        let http = reqwest::blocking::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while http.get(&s3.endpoint).send().is_err() {
            assert!(Instant::now() < deadline, "the S3 server did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        let made = http
            .put(format!("{}/{bucket}", s3.endpoint))
            .send()
            .unwrap();
        assert!(made.status().is_success(), "{}", made.status());
        Some(s3)
    }

    /// What `cordon serve --archive s3://…` is given to reach it.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID", "cordon-test".into()),
            ("AWS_SECRET_ACCESS_KEY", "cordon-test-secret".into()),
        ]
    }

    /// An object as the server holds it. moto reads who asks from the
    /// `Authorization` header and checks no signature.
    pub fn object(&self, key: &str) -> reqwest::blocking::Response {
        reqwest::blocking::Client::new()
            .get(format!("{}/{}/{key}", self.endpoint, self.bucket))
            .header(
                "authorization",
                "AWS4-HMAC-SHA256 Credential=cordon-test/20260101/us-east-1/s3/aws4_request, \
                 SignedHeaders=host, Signature=0",
            )
            .send()
            .unwrap()
    }
}
