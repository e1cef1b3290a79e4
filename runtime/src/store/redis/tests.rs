use super::builder::eviction_risk;
use super::*;

#[test]
fn eviction_policies_are_judged() {
    assert_eq!(eviction_risk("noeviction"), None);
    for policy in [
        "allkeys-lru",
        "allkeys-lfu",
        "allkeys-random",
        "volatile-lru",
        "volatile-ttl",
    ] {
        assert!(eviction_risk(policy).is_some(), "{policy}");
    }
    assert!(eviction_risk("volatile-lfu").unwrap().contains("completed"));
}

#[test]
fn failure_counters_cannot_be_spelled_by_a_record_key() {
    let key = |tenant: &str, k: &str| {
        let key = RecordKey::new(tenant, k);
        (
            escaped("toolkey", "", &key, Layout::Standalone),
            escaped("toolkey", FAILURES, &key, Layout::Standalone),
        )
    };
    let (record, counter) = key("acme", "invoice:acme:2026-10");
    assert_eq!(record, r"toolkey:acme:invoice\:acme\:2026-10");
    assert_eq!(counter, r"toolkey\failures:acme:invoice\:acme\:2026-10");
    // A tenant that tries to spell the counter's marker is escaped.
    let (forged, _) = key(r"\failures:acme", "invoice:acme:2026-10");
    assert_ne!(forged, counter);
    assert_eq!(forged, r"toolkey:\\failures\:acme:invoice\:acme\:2026-10");
    assert!(
        !counter.starts_with("toolkey:"),
        "SCAN <prefix>:* skips counters"
    );
}

/// The hash tag Redis Cluster hashes `key` by: what lies between the first `{` and the first
/// `}` after it, unless that is empty; otherwise the whole key.
fn hash_tag(key: &str) -> &str {
    if let Some(open) = key.find('{') {
        if let Some(len) = key[open + 1..].find('}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

#[test]
fn cluster_keys_carry_the_tenant_and_key_as_their_hash_tag() {
    let key = RecordKey::new("acme", "invoice:acme:2026-10");
    let record = escaped("toolkey", "", &key, Layout::Cluster);
    let counter = escaped("toolkey", FAILURES, &key, Layout::Cluster);
    assert_eq!(record, r"toolkey:{acme:invoice\:acme\:2026-10}");
    assert_eq!(counter, r"toolkey\failures:{acme:invoice\:acme\:2026-10}");
    assert_eq!(hash_tag(&record), r"acme:invoice\:acme\:2026-10");
    assert_eq!(
        tenant_prefix("toolkey", "ac{me}", Layout::Cluster),
        r"toolkey:{ac\(me\):"
    );
    // The standalone layout is what it always was.
    assert_eq!(
        escaped("toolkey", "", &key, Layout::Standalone),
        r"toolkey:acme:invoice\:acme\:2026-10"
    );
}

/// Tenants and keys made of every character that means something to the layout or to Redis's
/// hash tags: each pair gets its own key, its record and counter share a hash tag (so a
/// slot), the tag is never empty nor cut short, and the key reads back as the pair.
#[test]
fn no_tenant_or_key_can_move_or_empty_the_hash_tag() {
    let parts = [
        "", "{", "}", "{}", "}{", ":", "\\", "\\(", "\\)", "(", ")", "a}b", "{a", "a:b", "{{}}",
        "\\:",
    ];
    let mut seen = HashMap::new();
    for tenant in parts {
        for k in parts {
            let key = RecordKey::new(tenant, k);
            let record = escaped("toolkey", "", &key, Layout::Cluster);
            let counter = escaped("toolkey", FAILURES, &key, Layout::Cluster);
            let tag = hash_tag(&record);
            assert!(!tag.is_empty(), "{key:?}");
            assert_eq!(tag, hash_tag(&counter), "{key:?}");
            assert_eq!(
                format!("toolkey:{{{tag}}}"),
                record,
                "the tag is all of the tenant and key: {key:?}"
            );
            assert_eq!(Slot::for_key(&record), Slot::for_key(&counter), "{key:?}");
            assert_eq!(
                unescaped("toolkey", Layout::Cluster, record.as_bytes()),
                Some(key.clone())
            );
            assert_eq!(
                unescaped("toolkey", Layout::Cluster, counter.as_bytes()),
                None
            );
            assert!(
                !record.starts_with(r"toolkey\"),
                "a record is never a counter"
            );
            if let Some(other) = seen.insert(record.clone(), key.clone()) {
                panic!("{other:?} and {key:?} share {record}");
            }
        }
    }
    // Keys that are no record of the layout's.
    for foreign in [
        r"toolkey:acme:k",
        r"toolkey:{acme:k",
        r"toolkey:{acme:k}x",
        r"toolkey:{ac}me:k}",
        r"toolkey:{acme:\x}",
        r"toolkey:{acme:k:j}",
    ] {
        assert_eq!(
            unescaped("toolkey", Layout::Cluster, foreign.as_bytes()),
            None,
            "{foreign}"
        );
    }
}

#[test]
fn listing_cursors_name_their_shard() {
    let at = Position::Shard {
        slot: 5461,
        cursor: 1234,
    };
    assert_eq!(at.to_string(), "5461:1234");
    assert_eq!(Position::parse("5461:1234", Layout::Cluster), Some(at));
    assert_eq!(Position::parse("16384:0", Layout::Cluster), None);
    assert_eq!(Position::parse("1234", Layout::Cluster), None);
    assert_eq!(
        Position::parse("1234", Layout::Standalone),
        Some(Position::Server(1234))
    );
    assert_eq!(Position::parse("0:1234", Layout::Standalone), None);
}

#[test]
fn shards_are_named_by_their_primaries_lowest_slot() {
    let node = |port: i64, id: &str| {
        Value::Array(vec![
            Value::BulkString(b"127.0.0.1".to_vec()),
            Value::Int(port),
            Value::BulkString(id.as_bytes().to_vec()),
        ])
    };
    let range = |start: i64, end: i64, primary: Value, replica: Value| {
        Value::Array(vec![Value::Int(start), Value::Int(end), primary, replica])
    };
    // A primary that serves two ranges is one shard.
    let reply = Value::Array(vec![
        range(10923, 16383, node(7002, "c"), node(7003, "f")),
        range(0, 5460, node(7000, "a"), node(7004, "d")),
        range(5461, 10000, node(7001, "b"), node(7005, "e")),
        range(10001, 10922, node(7000, "a"), node(7004, "d")),
    ]);
    assert_eq!(parse_shards(reply).unwrap(), [0, 5461, 10923]);
    assert!(parse_shards(Value::Array(vec![Value::Array(vec![Value::Int(0)])])).is_err());
}

#[test]
fn glob_characters_are_escaped() {
    assert_eq!(glob_escape("a*b?[c]"), "a\\*b\\?\\[c\\]");
}

#[test]
fn replies_are_read_or_corrupt() {
    let key = RecordKey::new("t", "k");
    let text = |s: &str| Some(s.as_bytes().to_vec());
    assert!(matches!(
        parse_read(&key, vec![text("absent")]),
        Ok(Read::Absent)
    ));
    assert!(matches!(
        parse_read(&key, vec![text("corrupt"), text("why")]),
        Err(StoreError::Corrupt { .. })
    ));
    let record = |since: &str| {
        vec![
            text("record"),
            text("100"),
            text("in_progress"),
            text("tok"),
            text("fp"),
            text(since),
            text("200"),
            None,
            None,
            None,
        ]
    };
    assert!(matches!(
        parse_read(&key, record("50")),
        Ok(Read::Found(_, 100))
    ));
    assert!(matches!(
        parse_read(&key, record("fifty")),
        Err(StoreError::Corrupt { .. })
    ));
    let mut bad_utf8 = record("50");
    bad_utf8[3] = Some(vec![0xff]);
    assert!(matches!(
        parse_read(&key, bad_utf8),
        Err(StoreError::Corrupt { .. })
    ));
}
