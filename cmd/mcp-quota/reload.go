package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"reflect"
	"sync"
	"syscall"
	"time"

	"github.com/mcp-quota/mcp-quota/keystore"
	"github.com/mcp-quota/mcp-quota/rest"
)

// reloader reads the configuration again on SIGHUP and puts it in place
// of the running one (see keystore.Store.Replace): keys, callers,
// policies, reservations, principals and the credentials they name take
// effect for new calls; calls in flight finish under the configuration
// they started with. A configuration with an error is refused whole:
// the running one stays, the error is logged and shown by /healthz.
type reloader struct {
	e      environment
	c      common
	listen string
	keys   *keystore.Store
	log    *slog.Logger

	mu     sync.Mutex
	at     time.Time // of the last reload tried; zero before any
	err    error     // of the last reload tried; nil when it took effect
	loaded time.Time // when the running configuration was read
}

// start reloads on every SIGHUP from now until ctx ends or the returned
// function is called, which returns once a reload under way has ended:
// serve stops nothing under it.
func (r *reloader) start(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				r.reload()
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// reload reads the configuration file again and, when it is right,
// replaces the running one.
func (r *reloader) reload() {
	n, err := r.e.serveKeys(r.c, r.listen, r.log)
	if err == nil {
		err = restartOnly(r.keys, n)
	}
	now := time.Now()
	r.mu.Lock()
	r.at, r.err = now, err
	if err == nil {
		r.loaded = now
	}
	r.mu.Unlock()
	if err != nil {
		r.log.Error("the configuration was not reloaded: it has an error, and the running one stays", "config", r.e.configPath(r.c), "error", err)
		return
	}
	r.keys.Replace(n)
	r.log.Info("configuration reloaded", "config", r.e.configPath(r.c), "keys", n.KeyNames(), "callers", len(n.Callers()))
}

// tlsFiles are the TLS certificate's and key's paths in the configuration.
func tlsFiles(s *keystore.Store) [2]string {
	cert, key := s.TLS()
	return [2]string{cert, key}
}

// restartOnly refuses a configuration that changes what only a restart
// changes: the state and its timeout (the state is open), the TLS files'
// paths (the listener was set up with them), the bound on
// bodies' memory (the upstream client was set up with it) and the
// [oauth] table (the resource server was set up from it).
func restartOnly(old, n *keystore.Store) error {
	switch {
	case old.State() != n.State() || old.StateTimeout() != n.StateTimeout():
		return fmt.Errorf("the new configuration changes state or state_timeout, which take effect only at a restart: restart mcp-quota, or change them back")
	case tlsFiles(old) != tlsFiles(n):
		return fmt.Errorf("the new configuration changes tls_cert or tls_key, which take effect only at a restart (the files they name are read again when they change): restart mcp-quota, or change them back")
	case old.BodyMemory() != n.BodyMemory():
		return fmt.Errorf("the new configuration changes body_memory_mib, which takes effect only at a restart: restart mcp-quota, or change it back")
	case !reflect.DeepEqual(old.OAuth(), n.OAuth()):
		return fmt.Errorf("the new configuration changes the [oauth] table, which takes effect only at a restart: restart mcp-quota, or change it back")
	}
	return nil
}

// health is the state's checker for /healthz, with the configuration's
// state as its detail.
type health struct {
	rest.Checker
	r *reloader
}

// withDetail returns db with the reloads' detail, keeping what else
// /healthz reads of it (a database's Where).
func withDetail(db rest.Checker, r *reloader) rest.Checker {
	h := health{db, r}
	if w, ok := db.(interface{ Where() string }); ok {
		return healthWhere{h, w}
	}
	return h
}

type healthWhere struct {
	health
	w interface{ Where() string }
}

func (h healthWhere) Where() string { return h.w.Where() }

func (h health) Detail() map[string]any {
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	cfg := map[string]any{"loaded": h.r.loaded.UTC().Format(time.RFC3339)}
	if h.r.err != nil {
		msg, _ := h.r.keys.Scrubber().Scrub(h.r.err.Error())
		cfg["reload"] = map[string]any{"refused": h.r.at.UTC().Format(time.RFC3339), "error": msg}
	}
	return map[string]any{"config": cfg}
}
