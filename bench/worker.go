package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"time"
)

// The worker protocol: the parent writes a spec (one JSON line); the
// worker sets its client up and answers a ready line; the parent writes
// the run's start and end once every worker is ready; the worker runs the
// workload between them and answers its Tally.
type (
	readyMsg struct {
		Error string `json:"error,omitempty"`
	}
	goMsg struct {
		Start time.Time `json:"start"`
		End   time.Time `json:"end"`
	}
	doneMsg struct {
		Tally Tally  `json:"tally"`
		Error string `json:"error,omitempty"`
	}
)

// Worker is the main of a worker process: one caller of a run with
// several callers, in its own process. It reads its instructions from
// stdin and writes its answers to stdout (one JSON document a line);
// diag receives diagnostics. The command that runs it is given to Run
// as Options.Worker.
func Worker(ctx context.Context, stdin io.Reader, stdout, diag io.Writer) error {
	dec := json.NewDecoder(stdin)
	enc := json.NewEncoder(stdout)
	var s spec
	if err := dec.Decode(&s); err != nil {
		return fmt.Errorf("bench worker: reading the spec: %w", err)
	}
	c, err := newCaller(ctx, s, diag)
	if err != nil {
		enc.Encode(readyMsg{Error: err.Error()})
		return err
	}
	defer c.close()
	if err := enc.Encode(readyMsg{}); err != nil {
		return err
	}
	var g goMsg
	if err := dec.Decode(&g); err != nil {
		return fmt.Errorf("bench worker: reading the start: %w", err)
	}
	t, err := runCaller(ctx, c, s.Caller, g.Start, g.End)
	msg := doneMsg{Tally: t}
	if err != nil {
		msg.Error = err.Error()
	}
	return errors.Join(err, enc.Encode(msg))
}

// runCaller waits for start and runs the workload through c until end.
func runCaller(ctx context.Context, c caller, name string, start, end time.Time) (Tally, error) {
	if err := sleepUntil(ctx, start); err != nil {
		return Tally{Caller: name}, err
	}
	cctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	t := greedy(cctx, c, end, nil)
	t.Caller = name
	return t, ctx.Err()
}

func sleepUntil(ctx context.Context, t time.Time) error {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// A process is a running worker.
type process struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *json.Decoder
	stderr *tail
}

// startWorker starts a worker with the command newCmd makes and hands it
// s; it returns once the worker is ready.
func startWorker(ctx context.Context, newCmd func(context.Context) *exec.Cmd, s spec, diag io.Writer) (*process, error) {
	cmd := newCmd(ctx)
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, in: in, out: json.NewDecoder(bufio.NewReader(out)), stderr: &tail{w: diag}}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting a worker: %w", err)
	}
	if err := json.NewEncoder(in).Encode(s); err != nil {
		return nil, p.fail(err)
	}
	var r readyMsg
	if err := p.out.Decode(&r); err != nil {
		return nil, p.fail(err)
	}
	if r.Error != "" {
		return nil, p.fail(errors.New(r.Error))
	}
	return p, nil
}

// start tells the worker when to run.
func (p *process) start(start, end time.Time) error {
	return json.NewEncoder(p.in).Encode(goMsg{Start: start, End: end})
}

// wait returns the worker's tally once it has exited.
func (p *process) wait() (Tally, error) {
	var d doneMsg
	err := p.out.Decode(&d)
	p.in.Close()
	if werr := p.cmd.Wait(); err == nil && werr != nil {
		err = fmt.Errorf("worker: %w (stderr: %s)", werr, p.stderr.last())
	}
	if err == nil && d.Error != "" {
		err = fmt.Errorf("worker: %s", d.Error)
	}
	return d.Tally, err
}

// fail stops a worker that went wrong and explains why.
func (p *process) fail(err error) error {
	p.in.Close()
	if p.cmd.Process != nil {
		p.cmd.Process.Kill()
	}
	p.cmd.Wait()
	return fmt.Errorf("worker: %w (stderr: %s)", err, p.stderr.last())
}

// tail passes a worker's stderr on to w (when set) and keeps its end for
// error messages.
type tail struct {
	w   io.Writer
	buf []byte
}

func (t *tail) Write(b []byte) (int, error) {
	if t.w != nil {
		t.w.Write(b)
	}
	t.buf = append(t.buf, b...)
	if len(t.buf) > 2048 {
		t.buf = t.buf[len(t.buf)-2048:]
	}
	return len(b), nil
}

func (t *tail) last() string { return string(t.buf) }
