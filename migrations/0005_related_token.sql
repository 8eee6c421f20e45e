-- A lease writes one index entry fewer (issue 16). `resources_lock_token_idx` held every row with a token, so each
-- lease (a non-HOT update) entered its row in it, only for the statements that find a lease's rows by its token.
-- They need that index for the related rows alone: the main row's id is known to every one of them (it comes with
-- the lease), and they find it by primary key. So a related lock writes its holder's token twice, in `lock_token`
-- (what the row carries, as before) and in `related_token`, which only related locks set and which the new index
-- holds; a lease, a reset and every unlock clear it. Invariant: `related_token` is NULL or equals `lock_token`.
--
-- Rows migrated with a token get it in `related_token` too, main rows included, so every statement of the new
-- build finds every row an old build's lease holds (a main row found both ways is one row of one scan, and its
-- apply, reset or release clears both). Run with the replicas of older builds stopped: they would lock related
-- rows without `related_token`.
ALTER TABLE resources ADD COLUMN related_token bigint;
UPDATE resources SET related_token = lock_token WHERE lock_token IS NOT NULL;
DROP INDEX resources_lock_token_idx;
CREATE INDEX resources_related_token_idx ON resources (related_token) WHERE related_token IS NOT NULL;
