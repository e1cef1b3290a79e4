//! Configuring and connecting: the builder, its pool and the schema it checks.

use super::*;

impl PostgresStoreBuilder {
    pub(super) fn new(source: Source) -> Self {
        PostgresStoreBuilder {
            source,
            schema: None,
            table: "toolkey_records".into(),
            pool_size: 16,
            timeout: Duration::from_secs(5),
            run_migrations: true,
        }
    }

    /// The schema that holds the table (created by the migration if missing). Default: none, the
    /// connection's search path decides. A letter or `_`, then letters, digits or `_`; at most
    /// 63 bytes; kept in the case given (it is quoted).
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// The table's name. Default `toolkey_records`. A letter or `_`, then letters, digits or `_`;
    /// at most 48 bytes (its index is named after it); kept in the case given (it is quoted).
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// The most connections the store opens. Default 16.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// How long a call waits for a connection, and then for the server's answer, before it is
    /// [`StoreError::Unavailable`]. Default 5 s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Whether [`connect`](PostgresStoreBuilder::connect) runs [`PostgresStore::migrate`].
    /// Default true; turn it off where the application's role may not create tables and the
    /// deployment migrates instead.
    pub fn run_migrations(mut self, run: bool) -> Self {
        self.run_migrations = run;
        self
    }

    /// Builds the store and checks that the server answers (migrating if so configured).
    pub async fn connect(self) -> Result<PostgresStore, StoreError> {
        let schema = self
            .schema
            .as_deref()
            .map(|s| Ident::new("schema", s, 63))
            .transpose()?;
        let table = Ident::new("table", &self.table, 48)?;
        let pool = match self.source {
            Source::Pool(pool) => pool,
            Source::Url(url) => {
                let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
                    StoreError::Config(format!("postgres: bad connection string: {e}"))
                })?;
                if config.get_connect_timeout().is_none() {
                    config.connect_timeout(self.timeout);
                }
                if config.get_application_name().is_none() {
                    config.application_name("toolkey");
                }
                // The statements are written for READ COMMITTED (the server's default), whatever
                // the server or role was configured with.
                let options = match config.get_options() {
                    Some(theirs) => format!("{theirs} {ISOLATION_OPTION}"),
                    None => ISOLATION_OPTION.to_string(),
                };
                config.options(options);
                let manager = Manager::from_config(
                    config,
                    NoTls,
                    ManagerConfig {
                        recycling_method: RecyclingMethod::Fast,
                    },
                );
                Pool::builder(manager)
                    .max_size(self.pool_size)
                    .runtime(Runtime::Tokio1)
                    .wait_timeout(Some(self.timeout))
                    .create_timeout(Some(self.timeout))
                    .recycle_timeout(Some(self.timeout))
                    .build()
                    .map_err(|e| {
                        StoreError::Unavailable(format!("postgres: cannot build the pool: {e}"))
                    })?
            }
        };
        let store = PostgresStore {
            pool,
            sql: Arc::new(Sql::new(schema, table)),
            timeout: self.timeout,
        };
        if self.run_migrations {
            store.migrate().await?;
        } else {
            store.now().await?;
        }
        Ok(store)
    }
}
