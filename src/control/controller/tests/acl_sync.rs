//! ACL sync on the controller: rounds on the tick, removals, provenance, durability, failover.

use super::*;
use crate::control::acl_sync::SourceAclReader;
use crate::serve::authz::acl::{acl, AclBinding, AclFilter, Operation, PatternType, Permission};
use crate::serve::authz::sync::SourceAcls;
use crate::serve::authz::{AuthorizerConfig, Authz};
use crate::serve::session::{KafkaPrincipal, Session};

#[derive(Clone)]
struct FakeAcls {
    answer: Arc<Mutex<Result<SourceAcls, String>>>,
    rounds: Arc<Mutex<u32>>,
}

impl SourceAclReader for FakeAcls {
    fn read(&self, _: &MirrorDefinition, _: std::time::Instant) -> Result<SourceAcls, String> {
        *self.rounds.lock().unwrap() += 1;
        self.answer.lock().unwrap().clone()
    }
}

fn allow(rt: ResourceType, name: &str, pt: PatternType, user: &str, op: Operation) -> AclBinding {
    acl(
        rt,
        name,
        pt,
        &format!("User:{user}"),
        "*",
        op,
        Permission::Allow,
    )
}

impl FakeAcls {
    fn new(answer: Result<SourceAcls, String>) -> FakeAcls {
        FakeAcls {
            answer: Arc::new(Mutex::new(answer)),
            rounds: Arc::default(),
        }
    }

    /// Attaches ACL sync from this source to `c`, into a fresh deny-by-default authorizer.
    fn attach(&self, c: &mut Controller<FakeSource, FakeData>) -> Arc<Authz> {
        let authz = deny_by_default();
        c.attach_acl_sync(AclSyncPlane {
            authz: Arc::clone(&authz),
            source: Arc::new(self.clone()),
        });
        authz
    }
}

fn source_has(acls: &[AclBinding]) -> Result<SourceAcls, String> {
    Ok(SourceAcls::Acls {
        acls: acls.iter().cloned().collect(),
        skipped: 0,
    })
}

use crate::serve::authz::acl::ResourceType;

fn deny_by_default() -> Arc<Authz> {
    Authz::with_store(
        AuthorizerConfig::default().settings(true),
        Box::<crate::serve::authz::store::MemoryStore>::default(),
    )
    .unwrap()
}

fn may(a: &Authz, user: &str, op: Operation, rt: ResourceType, name: &str) -> bool {
    let mut s = Session::plaintext(Some("10.0.0.1:5000".parse().unwrap()));
    s.principal = KafkaPrincipal::user(user);
    a.authorize(&s, op, rt, name)
}

/// May `user` READ topic `topic`?
fn reads(a: &Authz, user: &str, topic: &str) -> bool {
    may(a, user, Operation::Read, ResourceType::Topic, topic)
}

fn status(c: &mut Controller<FakeSource, FakeData>) -> super::acl_schedule::AclSyncStatus {
    c.describe(Some("m1")).unwrap()[0].acl_sync.clone().unwrap()
}

#[test]
fn source_acls_sync_on_the_tick_keep_provenance_and_survive_restart_and_failover() {
    let rig = Rig::new();
    let mut c = rig.open();
    c.create("m1", &props()).unwrap();
    c.start("m1", "orders", None).unwrap();
    let alice_read = allow(
        ResourceType::Topic,
        "orders",
        PatternType::Literal,
        "alice",
        Operation::Read,
    );
    let alice_group = allow(
        ResourceType::Group,
        "g",
        PatternType::Literal,
        "alice",
        Operation::Read,
    );
    let bob_prefixed = allow(
        ResourceType::Topic,
        "ord",
        PatternType::Prefixed,
        "bob",
        Operation::Read,
    );
    let carol_other = allow(
        ResourceType::Topic,
        "payments",
        PatternType::Literal,
        "carol",
        Operation::Read,
    );
    let cluster = allow(
        ResourceType::Cluster,
        "kafka-cluster",
        PatternType::Literal,
        "dave",
        Operation::Alter,
    );
    let source = FakeAcls::new(source_has(&[
        alice_read.clone(),
        alice_group.clone(),
        bob_prefixed.clone(),
        carol_other.clone(),
        cluster.clone(),
    ]));
    let authz = source.attach(&mut c);
    c.tick(1_000).unwrap();
    let want: BTreeSet<AclBinding> = [
        alice_read.clone(),
        alice_group.clone(),
        bob_prefixed.clone(),
    ]
    .into();
    assert_eq!(
        authz.synced("m1"),
        want,
        "topics of the mirror and groups only"
    );
    assert!(reads(&authz, "alice", "orders"));
    assert!(!reads(&authz, "carol", "payments"));
    let s = status(&mut c);
    assert_eq!((s.state.as_str(), s.synced, s.error), ("syncing", 3, None));
    assert!(s.last_sync_ms.is_some());

    // An operator's own ACL on kmirror, and one the source removes.
    let erin = allow(
        ResourceType::Topic,
        "orders",
        PatternType::Literal,
        "erin",
        Operation::Read,
    );
    authz.create(&erin).unwrap();
    *source.answer.lock().unwrap() = source_has(&[alice_read.clone(), alice_group.clone()]);
    c.tick(2_000).unwrap();
    assert_eq!(
        *source.rounds.lock().unwrap(),
        1,
        "next round after the interval"
    );
    c.tick(31_000).unwrap();
    assert_eq!(
        authz.synced("m1"),
        [alice_read.clone(), alice_group.clone()].into()
    );
    assert!(!reads(&authz, "bob", "orders"), "removed on the source");
    assert!(reads(&authz, "erin", "orders"), "local ACL kept");

    // No authorizer on the source, then an error: the synced set stays, describe says why.
    *source.answer.lock().unwrap() = Ok(SourceAcls::NoAuthorizer);
    c.tick(62_000).unwrap();
    let s = status(&mut c);
    assert!(
        s.message.as_deref().unwrap().contains("no authorizer"),
        "{s:?}"
    );
    assert_eq!(s.synced, 2);
    *source.answer.lock().unwrap() = Err("connection refused".into());
    c.tick(93_000).unwrap();
    let s = status(&mut c);
    assert!(
        s.error.as_deref().unwrap().contains("connection refused"),
        "{s:?}"
    );
    assert_eq!(authz.synced("m1").len(), 2);

    // Restart: the stored set is in force as soon as sync is attached, before any round.
    drop(c);
    let mut c = rig.open();
    let source = FakeAcls::new(source_has(std::slice::from_ref(&alice_read)));
    let authz = source.attach(&mut c);
    assert_eq!(
        authz.synced("m1"),
        [alice_read.clone(), alice_group.clone()].into()
    );

    // Failover: no more rounds, the synced ACLs stay in force (also after a restart).
    c.command("m1", "orders", Command::Stop).unwrap();
    assert_eq!(state(&c, "orders", 0), Some(StateName::Stopped));
    c.tick(200_000).unwrap();
    assert_eq!(
        *source.rounds.lock().unwrap(),
        0,
        "the source no longer governs"
    );
    assert_eq!(status(&mut c).state, "stopped");
    assert_eq!(authz.synced("m1").len(), 2);
    drop(c);
    let mut c = rig.open();
    let authz = source.attach(&mut c);
    assert_eq!(authz.synced("m1").len(), 2);

    // Delete: the synced ACLs become kmirror's own and stay in force.
    c.delete("m1").unwrap();
    assert!(authz.synced("m1").is_empty());
    assert_eq!(authz.describe(&AclFilter::any()).len(), 2);
    assert!(reads(&authz, "alice", "orders"));
    drop(c);
    let c = rig.open();
    assert!(c.synced_acls.is_empty(), "records tombstoned");
}

#[test]
fn include_none_never_asks_the_source() {
    let rig = Rig::new();
    let mut c = rig.open();
    let mut p = props();
    p.insert("mirror.acls.include".into(), "none".into());
    c.create("m1", &p).unwrap();
    c.start("m1", "orders", None).unwrap();
    let source = FakeAcls::new(source_has(&[]));
    source.attach(&mut c);
    c.tick(1_000).unwrap();
    assert_eq!(*source.rounds.lock().unwrap(), 0);
    assert_eq!(status(&mut c).state, "off");
}
