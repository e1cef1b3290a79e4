use super::*;

#[test]
fn identifiers_are_validated_and_quoted() {
    assert_eq!(
        Ident::new("table", "Tool_calls2", 48).unwrap().quoted,
        "\"Tool_calls2\""
    );
    for bad in ["", "1abc", "a-b", "a\"b", "a b", "a;drop", "ä"] {
        assert!(Ident::new("table", bad, 48).is_err(), "{bad:?} accepted");
    }
    assert!(Ident::new("table", &"a".repeat(49), 48).is_err());
}

#[test]
fn statements_name_the_qualified_table() {
    let sql = Sql::new(
        Some(Ident::new("schema", "agents", 63).unwrap()),
        Ident::new("table", "calls", 48).unwrap(),
    );
    assert_eq!(sql.table, "\"agents\".\"calls\"");
    assert_eq!(sql.versions, "\"agents\".toolkey_schema_version");
    assert!(sql
        .reserve
        .contains("INSERT INTO \"agents\".\"calls\" (tenant"));
    assert!(sql.reserve.contains("UPDATE \"agents\".\"calls\" SET"));
    assert!(sql.read.contains("FROM \"agents\".\"calls\" WHERE"));
    assert_eq!(sql.failures_table, "\"agents\".\"calls_failures\"");
    assert!(sql
        .failures_create
        .contains("CREATE TABLE IF NOT EXISTS \"agents\".\"calls_failures\" ("));
    assert!(sql
        .failures_create
        .contains("\"calls_failures_ends\" ON \"agents\".\"calls_failures\""));
    for statement in [&sql.count_failure, &sql.failures, &sql.clear_failures] {
        assert!(
            statement.contains("\"agents\".\"calls_failures\""),
            "{statement}"
        );
        assert!(!statement.contains("\"agents\".\"calls\" "), "{statement}");
    }
    assert!(sql
        .count_failure
        .contains("INSERT INTO \"agents\".\"calls_failures\" AS f"));
}

#[test]
fn the_longest_table_name_keeps_its_counters_names_within_postgres_limit() {
    let table = "t".repeat(48);
    let sql = Sql::new(None, Ident::new("table", &table, 48).unwrap());
    // PostgreSQL cuts identifiers to 63 bytes: a cut name would not be the one created.
    for name in [
        format!("{table}_failures"),
        format!("{table}_failures_ends"),
    ] {
        assert!(name.len() <= 63, "{name}");
        assert!(sql.failures_create.contains(&format!("\"{name}\"")));
    }
}
