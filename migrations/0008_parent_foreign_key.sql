-- A row's parent must exist (DESIGN §2, "Parents"). A purge deletes a finished parent once no row names it, but on
-- PostgreSQL it cannot see a child that another transaction inserted and has not committed: without this key the
-- child committed after the parent was gone, naming no row. With it, an insert locks the parent it names (`FOR KEY
-- SHARE`, which the leases' `FOR NO KEY UPDATE` does not block), so a purge's `FOR UPDATE SKIP LOCKED` passes over
-- a parent while a child is being inserted under it, and an insert under a parent a purge has locked waits for the
-- purge and is refused once the parent is gone (SQLSTATE 23503, which PgStore reports as `Invalid`).
--
-- ON DELETE RESTRICT, not CASCADE or SET NULL: a purge deletes a parent only after its children (they may be
-- unfinished, leased, or of a kind no rule names), so deleting a parent that still has one is a mistake to refuse,
-- never a reason to delete or detach the child. A purge whose snapshot missed a child committed just before it
-- locked the parent is refused whole and runs again.
--
-- NOT VALID: rows already in the table are not checked, so the migration takes no long scan or lock on a populated
-- table; every insert from now on is. Rows an earlier purge left without their parent stay as they are. Once they
-- are deleted, `ALTER TABLE resources VALIDATE CONSTRAINT resources_parent_fk` checks the rest without blocking
-- writes. `resources_parent_idx` serves the key's check on delete (is the row still some row's parent?).
ALTER TABLE resources
    ADD CONSTRAINT resources_parent_fk FOREIGN KEY (parent_id) REFERENCES resources (id) ON DELETE RESTRICT NOT VALID;
