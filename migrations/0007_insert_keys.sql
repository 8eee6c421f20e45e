-- Keyed inserts (`Store::insert_keyed`; issue 42: a retried submit runs once). A key names the one row inserted
-- under it, for good: a client whose insert's outcome is unknown (an error, a lost reply) inserts again with the
-- same key and gets the first row back instead of a second one. The primary key is the unique index that decides
-- between two inserts with one key at once: the later waits for the earlier's transaction and finds its key.
CREATE TABLE insert_keys (
    key        text        PRIMARY KEY,
    row_id     bigint      NOT NULL,
    created_at timestamptz NOT NULL
);
