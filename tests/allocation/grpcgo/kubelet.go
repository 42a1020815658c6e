// A pod-resources server on grpc-go, the kubelet's own gRPC, for tests/allocation/test_grpc_go.py.
//
//	kubelet -socket PATH -answers DIR [-max-age 10s] [-max-idle 0]
//
// It serves v1.PodResourcesLister with a raw-bytes codec: each call answers the bytes of
// DIR/<Method>.bin (written by the test with Python's protobuf), read at the call, or, when
// DIR/<Method>.status exists, that status ("<code> <message>"). A method with neither is
// UNIMPLEMENTED, as grpc-go answers an unknown method. Every answer is printed as
// "answered <Method> <n>" on stdout, and each accepted connection as "connection <n>", after
// "ready" once it listens. SIGTERM stops it gracefully
// (GOAWAY, calls in flight finish), SIGKILL as a crash would.
//
// Built offline in GOPATH mode against Debian's golang-google-grpc-dev; the kubelet sets no
// keepalive limits of its own: -max-age and -max-idle are grpc-go's MaxConnectionAge and
// MaxConnectionIdle, which make it drain connections with a graceful GOAWAY.
package main

import (
	"context"
	"flag"
	"fmt"
	"io/ioutil"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// rawCodec stands in for the proto codec: messages are the bytes on the wire.
type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) { return v.([]byte), nil }

func (rawCodec) Unmarshal(data []byte, v interface{}) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

var answered, connections int64

// connectionCounter prints each connection the server accepts.
type connectionCounter struct{}

func (connectionCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return ctx
}

func (connectionCounter) HandleRPC(context.Context, stats.RPCStats) {}

func (connectionCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}

func (connectionCounter) HandleConn(_ context.Context, s stats.ConnStats) {
	if _, begun := s.(*stats.ConnBegin); begun {
		fmt.Printf("connection %d\n", atomic.AddInt64(&connections, 1))
	}
}

func handler(dir, method string) grpc.MethodDesc {
	serve := func(_ interface{}, _ context.Context, dec func(interface{}) error,
		_ grpc.UnaryServerInterceptor) (interface{}, error) {
		var request []byte
		if err := dec(&request); err != nil {
			return nil, err
		}
		if text, err := ioutil.ReadFile(filepath.Join(dir, method+".status")); err == nil {
			parts := strings.SplitN(strings.TrimSpace(string(text)), " ", 2)
			code, err := strconv.Atoi(parts[0])
			if err != nil || len(parts) != 2 {
				return nil, status.Error(codes.Internal, "bad status file")
			}
			return nil, status.Error(codes.Code(code), parts[1])
		}
		answer, err := ioutil.ReadFile(filepath.Join(dir, method+".bin"))
		if err != nil {
			return nil, status.Errorf(codes.Unimplemented, "unknown method %s", method)
		}
		fmt.Printf("answered %s %d\n", method, atomic.AddInt64(&answered, 1))
		return answer, nil
	}
	return grpc.MethodDesc{MethodName: method, Handler: serve}
}

func main() {
	socket := flag.String("socket", "", "unix socket to listen on")
	dir := flag.String("answers", "", "directory of <Method>.bin / <Method>.status")
	maxAge := flag.Duration("max-age", 0, "grpc-go MaxConnectionAge (0: none)")
	maxIdle := flag.Duration("max-idle", 0, "grpc-go MaxConnectionIdle (0: none)")
	flag.Parse()
	encoding.RegisterCodec(rawCodec{})

	params := keepalive.ServerParameters{}
	if *maxAge > 0 {
		params.MaxConnectionAge = *maxAge
		params.MaxConnectionAgeGrace = 10 * time.Second
	}
	if *maxIdle > 0 {
		params.MaxConnectionIdle = *maxIdle
	}
	server := grpc.NewServer(grpc.KeepaliveParams(params), grpc.StatsHandler(connectionCounter{}))
	desc := grpc.ServiceDesc{
		ServiceName: "v1.PodResourcesLister",
		HandlerType: (*interface{})(nil),
		Methods: []grpc.MethodDesc{
			handler(*dir, "List"), handler(*dir, "GetAllocatableResources"), handler(*dir, "Get"),
		},
	}
	server.RegisterService(&desc, struct{}{})

	os.Remove(*socket) // a stale socket of a killed run
	listener, err := net.Listen("unix", *socket)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM)
	go func() {
		<-stop
		server.GracefulStop()
	}()
	fmt.Println("ready")
	if err := server.Serve(listener); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
