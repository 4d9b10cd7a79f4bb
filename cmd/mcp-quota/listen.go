package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"syscall"
	"time"
)

// listenError says why what could not listen on addr, and which flag
// changes the address.
func listenError(what, addr, flagName string, err error) error {
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return fmt.Errorf("%s cannot listen on %s: the address is already in use (another mcp-quota serve, or another program): "+
			"stop it, or choose another address with %s HOST:PORT: %w", what, addr, flagName, err)
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return fmt.Errorf("%s cannot listen on %s: no network interface of this machine has that address: "+
			"choose another with %s HOST:PORT: %w", what, addr, flagName, err)
	case errors.Is(err, syscall.EACCES):
		return fmt.Errorf("%s cannot listen on %s: permission denied (ports below 1024 need privileges): "+
			"choose another address with %s HOST:PORT: %w", what, addr, flagName, err)
	}
	return fmt.Errorf("%s cannot listen on %s: choose another address with %s HOST:PORT: %w", what, addr, flagName, err)
}

// loopbackAddress reports whether a listen address, as typed, binds only
// loopback interfaces: 127.0.0.1:8787, [::1]:8787, localhost:8787. An
// empty host (":8787"), 0.0.0.0 and every other name bind beyond it; a
// name is resolved, and counts as loopback only when all its addresses are.
func loopbackAddress(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	if host == "localhost" {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil || len(ips) == 0 {
		return false
	}
	for _, ip := range ips {
		if !ip.IP.IsLoopback() {
			return false
		}
	}
	return true
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
