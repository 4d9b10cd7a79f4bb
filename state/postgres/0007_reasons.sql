-- Reasons are kept as data: why holds a gate's or a warning's reason as
-- the JSON form of reason.Reason (its kind and the fields that are not
-- zero), and the words are made where they are shown. It is text, as on
-- SQLite: nothing in SQL looks inside it. The columns of words stay: a
-- row written before holds its words there and no why, and reads back as
-- those words (reason.Said); a row written now leaves them empty.
ALTER TABLE gates ADD COLUMN why TEXT;
ALTER TABLE warnings ADD COLUMN why TEXT;
