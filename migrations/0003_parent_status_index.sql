-- Indexed reads for the controller pass (issue 17): a pass reads an operation's undone inbox messages (`parent_id =
-- $ AND kind = 'inbox' AND status = 'new'`), not every message the operation ever received. With this index the
-- read visits only the rows it returns, in id order; `resources_parent_idx` (parent, kind, id) still serves a
-- parent's rows of any status and the keyset read of the current incarnation's jobs (`id > $`), and
-- `resources_fetch_idx` (kind, status, ...) the free allocations. Built without CONCURRENTLY: sqlx runs each
-- migration in a transaction.
CREATE INDEX resources_parent_status_idx ON resources (parent_id, kind, status, id) WHERE parent_id IS NOT NULL;
