// Command kmm-fake-cri is the container runtime of the sandbox's kubelet nodes:
// the Kubernetes project's fake CRI runtime and image services on a unix
// socket. Pods go Running as far as the API can tell; nothing executes.
//
// Two things the fakes leave out, which a kubelet needs, are added here: every
// container gets a log path (with none, the kubelet's log cleanup globs "*" in
// its working directory and deletes what it finds), and images have a size
// (with none, every pod fails). Each CreateContainer is recorded with the CDI
// devices the kubelet passed, served as JSON on --http at /containers, next
// to /healthz.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	kubeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	"k8s.io/cri-client/pkg/util"
)

// created is one container the kubelet asked for.
type created struct {
	ID         string   `json:"id"`
	Namespace  string   `json:"namespace"`
	Pod        string   `json:"pod"`
	PodUID     string   `json:"podUID"`
	Container  string   `json:"container"`
	CDIDevices []string `json:"cdiDevices"`
	LogPath    string   `json:"logPath"`
}

type runtime struct {
	*fake.RemoteRuntime
	logs    string
	mu      sync.Mutex
	created []created
}

func (r *runtime) CreateContainer(ctx context.Context, req *kubeapi.CreateContainerRequest) (*kubeapi.CreateContainerResponse, error) {
	resp, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(req.GetSandboxConfig().GetLogDirectory(), req.GetConfig().GetLogPath())
	if req.GetSandboxConfig().GetLogDirectory() == "" || req.GetConfig().GetLogPath() == "" {
		logPath = filepath.Join(r.logs, resp.ContainerId+".log")
	}
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err == nil {
		if f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			f.Close()
		}
	}
	r.RuntimeService.Lock()
	if c, ok := r.RuntimeService.Containers[resp.ContainerId]; ok {
		c.LogPath = logPath
	}
	r.RuntimeService.Unlock()

	devices := []string{}
	for _, device := range req.GetConfig().GetCDIDevices() {
		devices = append(devices, device.GetName())
	}
	metadata := req.GetSandboxConfig().GetMetadata()
	r.mu.Lock()
	r.created = append(r.created, created{
		ID:         resp.ContainerId,
		Namespace:  metadata.GetNamespace(),
		Pod:        metadata.GetName(),
		PodUID:     metadata.GetUid(),
		Container:  req.GetConfig().GetMetadata().GetName(),
		CDIDevices: devices,
		LogPath:    logPath,
	})
	r.mu.Unlock()
	return resp, nil
}

func (r *runtime) serveHTTP(address string) error {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/containers", func(w http.ResponseWriter, _ *http.Request) {
		r.mu.Lock()
		defer r.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(r.created)
	})
	listener, err := net.Listen("tcp", address)
	if err != nil {
		return err
	}
	go func() { _ = http.Serve(listener, mux) }()
	return nil
}

func main() {
	listen := flag.String("listen", "", "unix socket path for the CRI runtime and image services")
	address := flag.String("http", "127.0.0.1:0", "address of /healthz and /containers")
	logs := flag.String("logs", "", "directory for the log files of containers the kubelet gave no log path")
	flag.Parse()
	if *listen == "" || *logs == "" {
		log.Fatal("--listen and --logs are required")
	}

	fakes := fake.NewFakeRemoteRuntime()
	fakes.ImageService.SetFakeImageSize(1 << 20)
	fakes.RuntimeService.FakeStatus = &kubeapi.RuntimeStatus{
		Conditions: []*kubeapi.RuntimeCondition{
			{Type: kubeapi.RuntimeReady, Status: true},
			{Type: kubeapi.NetworkReady, Status: true},
		},
	}
	served := &runtime{RemoteRuntime: fakes, logs: *logs}

	_ = os.Remove(*listen)
	listener, err := util.CreateListener("unix://" + *listen)
	if err != nil {
		log.Fatalf("listen on %s: %v", *listen, err)
	}
	server := grpc.NewServer()
	kubeapi.RegisterRuntimeServiceServer(server, served)
	kubeapi.RegisterImageServiceServer(server, served)
	if err := served.serveHTTP(*address); err != nil {
		log.Fatalf("listen on %s: %v", *address, err)
	}
	go func() { _ = server.Serve(listener) }()

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	server.Stop()
}
