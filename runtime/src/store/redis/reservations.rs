//! The call path: reserve, the fenced writes, take-over and reads.

use super::*;

#[async_trait]
impl Reservations for RedisStore {
    async fn reserve(
        &self,
        key: &RecordKey,
        tool: &str,
        fingerprint: &Fingerprint,
        token: &Token,
        lease: Duration,
    ) -> Result<Reservation, StoreError> {
        let (fp, lease) = (fingerprint.to_hex(), span_ms(lease).to_string());
        let keys = [self.redis_key(key), self.failures_key(key)];
        match self
            .read(
                &SCRIPTS.reserve,
                &keys,
                key,
                &[token.as_str(), &fp, &lease, tool],
                true,
            )
            .await?
        {
            Read::Reserved(failures) => Ok(Reservation::Reserved {
                token: token.clone(),
                failures,
            }),
            Read::Found(stored, now) => stored.to_record(key, now).map(Reservation::Existing),
            Read::Absent => Err(StoreError::Unavailable(
                "redis: reserve answered absent".into(),
            )),
        }
    }

    async fn complete(
        &self,
        key: &RecordKey,
        token: &Token,
        outcome: &Outcome,
        retain: Duration,
    ) -> Result<bool, StoreError> {
        let (text, retain) = (outcome.to_stored(), span_ms(retain).to_string());
        let margin = span_ms(TTL_MARGIN).to_string();
        self.fenced(
            &SCRIPTS.complete,
            key,
            &[token.as_str(), &text, &retain, &margin],
        )
        .await
    }

    async fn release(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        self.fenced(&SCRIPTS.release, key, &[token.as_str()]).await
    }

    async fn renew(
        &self,
        key: &RecordKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.fenced(
            &SCRIPTS.renew,
            key,
            &[token.as_str(), &span_ms(lease).to_string()],
        )
        .await
    }

    async fn mark_unknown(&self, key: &RecordKey, token: &Token) -> Result<bool, StoreError> {
        self.fenced(&SCRIPTS.mark_unknown, key, &[token.as_str()])
            .await
    }

    async fn take_over(
        &self,
        key: &RecordKey,
        stale: &Token,
        lease: Duration,
    ) -> Result<Option<Token>, StoreError> {
        let token = Token::generate();
        let lease = span_ms(lease).to_string();
        let won = self
            .fenced(
                &SCRIPTS.take_over,
                key,
                &[stale.as_str(), token.as_str(), &lease],
            )
            .await?;
        Ok(won.then_some(token))
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<Record>, StoreError> {
        match self
            .read(&SCRIPTS.get, &[self.redis_key(key)], key, &[], false)
            .await?
        {
            Read::Found(stored, now) if !stored.absent(now) => stored.to_record(key, now).map(Some),
            _ => Ok(None),
        }
    }
}
