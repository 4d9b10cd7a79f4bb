package pacer

// timerFunc returns f as the function of one of the Pacer's timers (a
// lease that runs out, what was learned written alone): it runs f unless
// the Pacer has closed, and Close waits for it. The count is taken under
// p.mu before Close marks the Pacer closed, so Close never misses one,
// and a timer that fires after Close does nothing: Close gave back every
// lease and wrote everything learned itself.
func (p *Pacer) timerFunc(f func()) func() {
	return func() {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return
		}
		p.timers.Add(1)
		p.mu.Unlock()
		defer p.timers.Done()
		f()
	}
}
