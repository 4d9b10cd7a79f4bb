-- An attempt's reason is kept as data too: why holds it as the JSON form
-- of reason.Reason, as for gates and warnings (0007). It is text, as on
-- SQLite: nothing in SQL looks inside it. The column of words stays: a
-- row written before holds its words there and no why, and reads back as
-- those words (reason.Said); a row written now holds both, the words for
-- the hosts of the previous version that share the database while they
-- are upgraded one at a time.
ALTER TABLE attempts ADD COLUMN why TEXT;
