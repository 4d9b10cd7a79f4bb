-- An attempt's reason is kept as data too: why holds it as the JSON form
-- of reason.Reason, as for gates and warnings (0013). The column of words
-- stays: a row written before holds its words there and no why, and reads
-- back as those words (reason.Said); a row written now holds both, the
-- words for the processes of the previous version that share the file
-- while they are replaced.
ALTER TABLE attempts ADD COLUMN why TEXT;
