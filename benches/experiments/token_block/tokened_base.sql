tokened AS (
    SELECT ordered.id, nextval('lock_tokens') AS token
    FROM (SELECT id, last_processed_at FROM picked ORDER BY last_processed_at NULLS FIRST, id) AS ordered
)
