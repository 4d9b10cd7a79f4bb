package state

import "runtime"

// StaleCheck makes the last quick_check that passed on db stand no longer,
// as if checkEvery had gone by since: db's next Check runs one. It first
// lets a quick_check running in the background end, so that its pass
// cannot stand again after.
func StaleCheck(db *DB) {
	for {
		db.wh.mu.Lock()
		if !db.wh.checking {
			db.wh.checked = db.wh.checked.Add(-checkEvery)
			db.wh.mu.Unlock()
			return
		}
		db.wh.mu.Unlock()
		runtime.Gosched()
	}
}
