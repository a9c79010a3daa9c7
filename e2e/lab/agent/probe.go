package agent

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// probe runs the readiness probes that are due. Only httpGet is
// supported; a container without a readiness probe is ready once running.
func (w *podWorker) probe(pod *corev1.Pod, ips []string) {
	now := time.Now()
	for _, c := range pod.Spec.Containers {
		st := w.containers[c.Name]
		if st == nil || st.id == "" {
			continue
		}
		p := c.ReadinessProbe
		if p == nil || p.HTTPGet == nil {
			st.ready = true
			continue
		}
		if now.Before(st.startedAt.Add(time.Duration(p.InitialDelaySeconds)*time.Second)) || now.Before(st.nextProbe) {
			continue
		}
		st.nextProbe = now.Add(time.Duration(max(p.PeriodSeconds, 1)) * time.Second)
		if err := httpProbe(p, &c, ips[0]); err != nil {
			st.okRun, st.failRun = 0, st.failRun+1
			if st.failRun >= max(p.FailureThreshold, 1) {
				st.ready = false
			}
		} else {
			st.okRun, st.failRun = st.okRun+1, 0
			if st.okRun >= max(p.SuccessThreshold, 1) {
				st.ready = true
			}
		}
	}
}

func httpProbe(p *corev1.Probe, c *corev1.Container, podIP string) error {
	g := p.HTTPGet
	port, err := probePort(g.Port, c)
	if err != nil {
		return err
	}
	host := podIP
	if g.Host != "" {
		host = g.Host
	}
	client := &http.Client{Timeout: time.Duration(max(p.TimeoutSeconds, 1)) * time.Second,
		Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get("http://" + net.JoinHostPort(host, strconv.Itoa(port)) + g.Path)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("HTTP probe failed with status %d", resp.StatusCode)
	}
	return nil
}

func probePort(port intstr.IntOrString, c *corev1.Container) (int, error) {
	if port.Type == intstr.Int {
		return port.IntValue(), nil
	}
	for _, p := range c.Ports {
		if p.Name == port.StrVal {
			return int(p.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("probe port %q not found among the container's ports", port.StrVal)
}
