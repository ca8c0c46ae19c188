// etcd for the test control plane: a single member from go.etcd.io/etcd/server/v3/embed, listening
// on the loopback addresses it is given, its data in --data-dir. It runs until killed.
package main

import (
	"flag"
	"log"
	"net/url"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	dataDir := flag.String("data-dir", "", "member data directory")
	client := flag.String("listen-client-urls", "http://127.0.0.1:2379", "client URL (one)")
	peer := flag.String("listen-peer-urls", "http://127.0.0.1:2380", "peer URL (one)")
	flag.Parse()

	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cfg.LogLevel = "warn"
	clientURL, err := url.Parse(*client)
	if err != nil {
		log.Fatalf("--listen-client-urls: %v", err)
	}
	peerURL, err := url.Parse(*peer)
	if err != nil {
		log.Fatalf("--listen-peer-urls: %v", err)
	}
	cfg.ListenClientUrls = []url.URL{*clientURL}
	cfg.AdvertiseClientUrls = []url.URL{*clientURL}
	cfg.ListenPeerUrls = []url.URL{*peerURL}
	cfg.AdvertisePeerUrls = []url.URL{*peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatalf("etcd: %v", err)
	}
	defer e.Close()
	<-e.Server.ReadyNotify()
	log.Printf("etcd ready on %s", clientURL)
	log.Fatal(<-e.Err())
}
