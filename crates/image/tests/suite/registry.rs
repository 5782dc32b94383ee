//! Pulls from a real registry (Debian's `docker-registry`, the CNCF
//! distribution server) on loopback, with htpasswd auth, holding images
//! pushed by `skopeo`.

use std::path::Path;
use std::sync::Mutex;

use cordon_image::auth::{Credentials, Sources};
use cordon_image::registry::{Progress, pull};
use cordon_image::store::Store;
use cordon_image::{Digest, ImageRef};
use cordon_testkit::registry::Registry;

use super::store::{diff_id, two_layers, write_layout};

fn auth_file(dir: &Path, registry: &Registry) -> Sources {
    Sources {
        files: vec![registry.auth_file(dir)],
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn an_image_is_pulled_with_the_users_credentials_by_tag_and_by_digest() {
    let registry = Registry::start();
    let src = tempfile::tempdir().unwrap();
    let layers = two_layers();
    write_layout(src.path(), "v1", &layers);
    registry.push(src.path(), "v1", "team/tools");
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path()).unwrap();
    let reference: ImageRef = format!("{}/team/tools:v1", registry.addr).parse().unwrap();
    let rt = rt();

    // Without credentials the registry says no, and nothing is stored.
    let e = rt
        .block_on(pull(&store, &reference, Credentials::Anonymous, &|_| {}))
        .unwrap_err()
        .to_string();
    assert!(e.to_lowercase().contains("not authorized"), "{e}");
    assert!(store.list().is_empty());

    let creds = auth_file(root.path(), &registry).for_registry(&registry.addr, "team/tools");
    let said = Mutex::new(Vec::new());
    let image = rt
        .block_on(pull(&store, &reference, creds.clone(), &|p| {
            said.lock().unwrap().push(p)
        }))
        .unwrap();
    assert_eq!(image.layers, [diff_id(&layers[0]), diff_id(&layers[1])]);
    assert_eq!(image.working_dir.as_deref(), Some("/srv"));
    let top = store.layer_dir(&image.layers[1]);
    assert_eq!(
        std::fs::read_to_string(top.join("srv/app.py")).unwrap(),
        "print('hi')\n"
    );
    let fetched = |said: &Mutex<Vec<Progress>>| {
        said.lock()
            .unwrap()
            .iter()
            .filter(|p| matches!(p, Progress::Fetching { .. }))
            .count()
    };
    assert_eq!(fetched(&said), 2, "{:?}", said.lock().unwrap());

    // By digest, and twice at once: nothing is downloaded again.
    let by_digest: ImageRef = format!("{}/team/tools@{}", registry.addr, image.manifest)
        .parse()
        .unwrap();
    let again = Mutex::new(Vec::new());
    let note = |p| again.lock().unwrap().push(p);
    let (a, b) = rt.block_on(async {
        tokio::join!(
            pull(&store, &by_digest, creds.clone(), &note),
            pull(&store, &by_digest, creds.clone(), &note),
        )
    });
    assert_eq!(a.unwrap().layers, image.layers);
    assert_eq!(b.unwrap().manifest, image.manifest);
    assert_eq!(fetched(&again), 0, "{:?}", again.lock().unwrap());
    assert_eq!(store.list().len(), 2, "by tag and by digest");
    // A digest the registry does not hold.
    let missing: ImageRef = format!("{}/team/tools@{}", registry.addr, Digest::of(b"none"))
        .parse()
        .unwrap();
    assert!(rt.block_on(pull(&store, &missing, creds, &|_| {})).is_err());
}
