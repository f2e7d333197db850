-- An alert's firing episode handed to the receivers is saved before it is sent, so that its
-- resolution is owed to them across restarts (a SIGKILL right after the send included).
ALTER TABLE alerts ADD COLUMN notified BOOLEAN DEFAULT false;
