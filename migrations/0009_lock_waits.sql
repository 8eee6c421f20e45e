-- Parked waiters (DESIGN §3): an item whose related lock is contended may wait in its replica with its lease kept,
-- instead of being reset for retry. The store records that someone waits on each row that turned it away
-- (`lock_waited`), and the write that frees such a row (its holder's apply, reset, release or failure: any
-- update that clears `lock_token`) sends the wake hint `lock_waits:{id}` on the store's hint channel, in the same
-- transaction, so it is delivered at commit as the writes' own hints are. The channel is the session's
-- `lockstep.wake_channel` setting, which every session of a PgStore starts with; a session without it (a caller's
-- own connection) frees no lock. The payload's sender is 0 (`listen::CALLER_TRANSACTION`): every store's listener
-- forwards it, the freeing store's own included.
--
-- The trigger fires only for a row someone waits on (its WHEN clause), so the writes of rows no one waits on pay a
-- test of one column. MemStore keeps the same record (`State::waited`).
ALTER TABLE resources ADD COLUMN lock_waited boolean NOT NULL DEFAULT false;

CREATE FUNCTION lockstep_wake_waiters() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    channel text := current_setting('lockstep.wake_channel', true);
BEGIN
    NEW.lock_waited := false;
    IF channel IS NOT NULL AND channel <> '' THEN
        PERFORM pg_notify(channel, '0000000000000000:lock_waits:' || NEW.id);
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER resources_wake_waiters
    BEFORE UPDATE OF lock_token ON resources
    FOR EACH ROW
    WHEN (OLD.lock_waited AND OLD.lock_token IS NOT NULL AND NEW.lock_token IS NULL)
    EXECUTE FUNCTION lockstep_wake_waiters();
